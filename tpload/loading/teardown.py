"""Giving memory back after :meth:`tpload.RankShards.release`.

Dropping the arena frees the served tensors (all views of it), but freed
memory can linger in caches: torch's CUDA caching allocator keeps device
blocks, its host allocator keeps the pinned staging buffers, and glibc keeps
freed heap pages. A serving startup that releases one load to make room for
another (or for the KV cache) needs them returned, not cached.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

import torch

from ..distributed.torch_private import empty_host_cache

log = logging.getLogger("tpload")


def give_back(device: torch.device) -> None:
    """Return cached device blocks, pinned host buffers and free heap pages."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        empty_host_cache()  # pinned staging buffers
    _trim_heap()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, found once per process: ``find_library`` runs ``ldconfig``/``gcc``
    subprocesses (slow on a worker bound to one busy core)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # musl, macOS: nothing to trim this way
        return None


def _trim_heap() -> None:
    """Hand freed heap pages back to the kernel (no-op where there is no malloc_trim)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    else:
        log.debug("no malloc_trim on this platform; freed heap pages stay with the allocator")

"""Every private torch API tpload uses, in one place, each with a fallback for a torch without it.

A private name can change or go in any torch release; here each one is looked up when called
(``getattr`` on the module or object, never at import), and when it is missing the function does
what the public API allows instead. Each function names what it falls back to; the unit tests run
both paths with stand-in objects that lack the attribute.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("tpload")


def default_store(c10d: Any = None) -> dist.Store | None:
    """The default group's rendezvous store (``distributed_c10d._get_default_store``).

    Fallback: None when the function is missing or there is no default group; the caller then
    connects to ``MASTER_ADDR:MASTER_PORT`` itself (exchange.py), or does without the store.
    """
    c10d = c10d if c10d is not None else dist.distributed_c10d
    get = getattr(c10d, "_get_default_store", None)
    if get is None:
        return None
    try:
        return get()
    except (RuntimeError, ValueError, AttributeError):  # no default group
        return None


def has_cpu_backend(group: Any) -> bool:
    """Whether ``group`` runs collectives on CPU tensors (gloo, or ``cpu:gloo,cuda:nccl``):
    ``ProcessGroup._get_backend(cpu)``.

    Fallback: the public ``dist.get_backend_config(group)`` (``"cpu:gloo,cuda:nccl"``) names a CPU
    backend.
    """
    get = getattr(group, "_get_backend", None)
    if get is not None:
        try:
            get(torch.device("cpu"))
            return True
        except RuntimeError:  # no backend registered for the CPU
            return False
    try:
        config = dist.get_backend_config(group)
    except (RuntimeError, ValueError, AttributeError):
        return False
    return any(part.strip().startswith("cpu:") for part in str(config).split(","))


def empty_host_cache(c: Any = None) -> bool:
    """Return the pinned host buffers torch's host allocator caches (``torch._C._host_emptyCache``);
    True if it ran.

    Fallback: nothing (False): the buffers stay cached until the process ends; device blocks and
    heap pages are still given back (loading/teardown.py).
    """
    c = c if c is not None else torch._C
    host_empty: Callable[[], None] | None = getattr(c, "_host_emptyCache", None)
    if host_empty is None:
        log.debug("this torch has no _host_emptyCache: pinned host buffers stay cached")
        return False
    host_empty()
    return True


def torch_function_off(c: Any = None) -> contextlib.AbstractContextManager[None]:
    """A context in which tensor subclasses' ``__torch_function__`` is off, so a subclass can run
    torch's own op on itself (``torch._C.DisableTorchFunctionSubclass``, as torch's own
    ``Tensor.__torch_function__`` does).

    Fallback: ``torch._C.DisableTorchFunction`` (every override off, modes included: broader, same
    result for the hand-off's windows); with neither, a RuntimeError naming what is missing, since
    without one the subclass would call itself forever.
    """
    c = c if c is not None else torch._C
    for name in ("DisableTorchFunctionSubclass", "DisableTorchFunction"):
        off = getattr(c, name, None)
        if off is not None:
            entered: contextlib.AbstractContextManager[None] = off()
            return entered
    raise RuntimeError(
        f"torch {getattr(torch, '__version__', '?')} has neither DisableTorchFunctionSubclass nor "
        "DisableTorchFunction: tpload's hand-off windows cannot run torch's ops on themselves"
    )


def tree_leaves(tree: Any, pytree: Any = None) -> list[Any]:
    """The leaves of nested tuples, lists and dicts (``torch.utils._pytree.tree_leaves``).

    Fallback: a plain walk of tuples, lists and dict values (what op arguments are made of).
    """
    if pytree is None:
        try:
            import torch.utils._pytree as torch_pytree
        except ImportError:
            torch_pytree = None
        pytree = torch_pytree
    leaves = getattr(pytree, "tree_leaves", None)
    if leaves is not None:
        found: list[Any] = leaves(tree)
        return found
    out: list[Any] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (tuple, list)):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        else:
            out.append(node)
    return out

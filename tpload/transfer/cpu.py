"""The CPU transfer: the window's copy into its slot and its fingerprint are one compiled pass."""

from __future__ import annotations

import ctypes
import mmap
import sys
from threading import Thread
from types import TracebackType

import numpy as np
import torch

from ..kernels.fingerprint import HostFingerprint
from ..model.values import Triple
from ..storage.reader import CHUNK_BYTES

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not in the mmap module of Python 3.11


def new_arena(nbytes: int, *, in_background: bool = False) -> tuple[torch.Tensor, Thread | None]:
    """The rank's arena on the CPU: an anonymous map, its pages populated in one call
    (MADV_POPULATE_WRITE), and the thread doing it when ``in_background`` (else None).

    Faulting fresh memory page by page during the copies costs more than the copies themselves,
    and one populate call is faster than the faults. The call lets go of the GIL (it goes through
    ctypes), so in the background the first reads start at once instead of after the populate
    (seconds for a large rank); a copy that reaches a page first simply faults it in. No
    MADV_HUGEPAGE: with THP defrag on "madvise" the faults stall in compaction. (Figures:
    docs/benchmarks.md.)
    """
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8), None
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arena = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the map; unmapped with the last view
    if sys.platform != "linux":
        return arena, None
    if not in_background:
        _populate(arena, nbytes)
        return arena, None
    worker = Thread(
        target=_populate, args=(arena, nbytes), name="tpload-arena-populate", daemon=True
    )
    worker.start()
    return arena, worker


def _populate(arena: torch.Tensor, nbytes: int) -> None:
    """MADV_POPULATE_WRITE over the arena through ctypes (the GIL let go for the call); a kernel
    without it (< 5.14) answers EINVAL and the pages fault in on first touch instead."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    madvise(arena.data_ptr(), nbytes, _MADV_POPULATE_WRITE)


class CpuTransfer:
    """Serves windows on the CPU: the served fingerprint is the fingerprint of the words the copy
    wrote."""

    chunk_bytes = CHUNK_BYTES
    host_slots = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._populating: Thread | None = None

    def arena(self, nbytes: int) -> torch.Tensor:
        buffer, self._populating = new_arena(nbytes, in_background=True)
        return buffer

    def copy(
        self, view: np.ndarray, dst: np.ndarray, fp: HostFingerprint, first_row: int, first_col: int
    ) -> None:
        fp.add(view, first_row, dst=dst, first_col=first_col)

    def served(self, slot: np.ndarray, fp: HostFingerprint) -> tuple[Triple, None]:
        return fp.value(), None

    def stage(
        self, view: np.ndarray, fp: HostFingerprint, first_row: int, first_col: int
    ) -> np.ndarray:
        fp.add(view, first_row, first_col=first_col)
        return view

    def upload(self, host: np.ndarray) -> np.ndarray:
        return host

    def __enter__(self) -> CpuTransfer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._populating is not None:  # nothing of the load left running after it
            self._populating.join()
            self._populating = None

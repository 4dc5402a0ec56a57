"""The CUDA transfer: fused copy + fingerprint into pinned memory, then host-to-device on a side
stream.

Each block goes into one of two pinned buffers by the compiled pass that also
fingerprints it (one read of the staging buffer); a non-blocking copy on a
side stream sends it to its slot (or to a device temporary the decoder reads),
and an event recorded after that copy guards the pinned buffer's reuse, so
filling the next buffer overlaps the previous copy. Decodes and device
fingerprints run on the same side stream, so stream order alone makes a
staged block safe to read. Nothing here syncs the host but the pinned-buffer
events and the exit: the device fingerprints stay on the device until the
settlement reads them all at once, before the exchange.

The stream, events and pinned allocation come from a :class:`Backend`; tests
drive this same code on the CPU with a stand-in one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import numpy as np
import torch

from ..kernels.fingerprint import DeviceFingerprint, HostFingerprint, as_bytes2d
from ..model.values import Triple
from .base import CUDA_CHUNK_BYTES

CHUNK_BYTES = (
    CUDA_CHUNK_BYTES  # a PCIe copy this size amortizes its launch; the staging ring holds four
)


class Stream(Protocol):
    """A side stream (torch.cuda.Stream, or a test's stand-in)."""

    def synchronize(self) -> None: ...


class Event(Protocol):
    """An event on a stream (torch.cuda.Event, or a test's stand-in)."""

    def synchronize(self) -> None: ...

    def record(self, stream: Stream) -> None: ...


@dataclass
class Backend:
    """Where the pinned buffers, the side stream and its events come from."""

    pinned: Callable[[int], torch.Tensor]
    stream: Callable[[], Stream]
    event: Callable[[], Event]
    on_stream: Callable[[Stream], contextlib.AbstractContextManager[object]]

    @classmethod
    def cuda(cls, device: torch.device) -> Backend:
        return cls(
            pinned=lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True),
            stream=lambda: torch.cuda.Stream(device),
            event=torch.cuda.Event,
            on_stream=torch.cuda.stream,
        )


class CudaTransfer:
    """Serves windows on a GPU through two pinned buffers and a side stream."""

    chunk_bytes = CHUNK_BYTES
    host_slots = False

    def __init__(
        self,
        device: torch.device,
        backend: Backend | None = None,
        *,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.backend = backend or Backend.cuda(device)
        self.pinned = [self.backend.pinned(chunk_bytes) for _ in range(2)]
        self.events = [self.backend.event() for _ in range(2)]
        self.stream = self.backend.stream()
        self.turn = 0
        self._ctx: contextlib.AbstractContextManager[object] | None = None

    def arena(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _pinned(
        self, view: np.ndarray, fp: HostFingerprint, first_row: int, first_col: int
    ) -> tuple[torch.Tensor, int]:
        """``view`` in the next pinned buffer (fingerprinted on the way); that buffer's index."""
        n = view.size
        i = self.turn = 1 - self.turn
        self.events[i].synchronize()  # the copy that last read this pinned buffer is done
        if (
            self.pinned[i].numel() < n
        ):  # a block wider than a buffer (the reader never makes one): grow
            self.pinned[i] = self.backend.pinned(n)
        host = self.pinned[i][:n].view(view.shape)
        fp.add(view, first_row, dst=host.numpy(), first_col=first_col)
        return host, i

    def copy(
        self,
        view: np.ndarray,
        dst: torch.Tensor,
        fp: HostFingerprint,
        first_row: int,
        first_col: int,
    ) -> None:
        host, i = self._pinned(view, fp, first_row, first_col)
        with self.backend.on_stream(self.stream):
            dst.copy_(host, non_blocking=True)
            self.events[i].record(self.stream)

    def served(self, slot: torch.Tensor, fp: HostFingerprint) -> tuple[torch.Tensor, Triple]:
        b = slot if slot.dtype == torch.uint8 and slot.dim() == 2 else as_bytes2d(slot)
        device_fp = DeviceFingerprint(b.shape[1], b.device)
        device_fp.add(b, 0)
        return device_fp.value(), fp.value()

    def stage(
        self, view: np.ndarray, fp: HostFingerprint, first_row: int, first_col: int
    ) -> torch.Tensor:
        host, i = self._pinned(view, fp, first_row, first_col)
        with self.backend.on_stream(self.stream):
            out = torch.empty(view.shape, dtype=torch.uint8, device=self.device)
            out.copy_(host, non_blocking=True)
            self.events[i].record(self.stream)
        return out

    def upload(self, host: np.ndarray) -> torch.Tensor:
        with self.backend.on_stream(self.stream):
            out = torch.from_numpy(np.ascontiguousarray(host)).to(
                self.device
            )  # small: a synchronous copy
        return out

    def __enter__(self) -> CudaTransfer:
        self._ctx = self.backend.on_stream(self.stream)
        self._ctx.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(exc_type, exc, tb)
            self._ctx = None
        self.stream.synchronize()

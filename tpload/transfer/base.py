"""What the load loop needs from a device (:class:`Transfer`), and the sizes ``tpload plan`` reads
without loading a transfer."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:  # annotations only
    from ..kernels.fingerprint import HostFingerprint
    from ..model.values import Triple


CUDA_CHUNK_BYTES = 16 << 20
"""The CUDA transfer's staging block: a PCIe copy this size amortizes its launch (here, so that
``tpload plan`` can size the pinned buffers without loading the kernels)."""


class Transfer(Protocol):
    """What the load loop needs from a device."""

    device: torch.device
    chunk_bytes: int
    """The staging block size that suits this device (cache-sized on the CPU, larger for PCIe)."""
    host_slots: bool
    """Whether :meth:`copy` writes slots through numpy (host memory) or torch (a device)."""

    def arena(self, nbytes: int) -> torch.Tensor:
        """One uint8 buffer on the device holding every served tensor of the rank."""

    def copy(
        self,
        view: np.ndarray,
        dst: np.ndarray | torch.Tensor,
        fp: HostFingerprint,
        first_row: int,
        first_col: int,
    ) -> None:
        """``view`` (host bytes) into ``dst`` (the same-shaped part of a slot's 2-D bytes: numpy on
        the CPU, a device tensor elsewhere), adding it to ``fp``."""

    def served(
        self, slot: np.ndarray | torch.Tensor, fp: HostFingerprint
    ) -> tuple[Triple | torch.Tensor, Triple | None]:
        """(the fingerprint of the slot bytes ``copy`` filled, what it must equal or None when it is
        by construction the copy's own)."""

    def stage(
        self, view: np.ndarray, fp: HostFingerprint, first_row: int, first_col: int
    ) -> np.ndarray | torch.Tensor:
        """``view`` where the decoder can read it (adding it to ``fp``)."""

    def upload(self, host: np.ndarray) -> np.ndarray | torch.Tensor:
        """A small gathered host array (a scale window) where the decoder can read it."""

    def __enter__(self) -> Transfer: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

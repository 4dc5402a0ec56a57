"""The transfer of a device: the CPU's fused copy, or CUDA's pinned staging (imported only on a
CUDA device)."""

from __future__ import annotations

import torch

from .base import Transfer
from .cpu import CpuTransfer


def for_device(device: torch.device) -> Transfer:
    if device.type == "cuda":
        from .cuda import CudaTransfer

        return CudaTransfer(device)  # imported on a CUDA device only
    return CpuTransfer(device)

"""The replicas' wire: the group and the device their messages travel on (sources/replicas.py).

A CUDA load whose group has an NCCL backend (the world tpload makes under torchrun is
``cpu:gloo,cuda:nccl``; a caller's group may be NCCL alone) sends its replicas' headers and window
bytes as device tensors over that group: NCCL, over NVLink or the cluster network. Any other load
sends host tensors over its CPU group (gloo), as the exchange does.

The ring stays on the host: the loop and the fingerprint read host bytes. Beside each host buffer
is a wire buffer. On the CPU the wire buffer IS the host buffer (a view, no copy); on a device the
sender copies the fingerprinted host piece into its wire buffer before the send, and the receiver
copies its wire buffer into the host piece once the receive is done, so everything after the
transfer runs unchanged. Device memory stays bounded by the ring: 2 x ring x the reader's chunk.

A dead or hung peer ends every wait within the load's timeout, on either backend:

* gloo: the connection to a dead peer closes, so the wait fails at once naming the peer; a peer
  that hangs fails it when the timeout given to the wait passes.
* NCCL: a wait with an explicit timeout blocks the CPU thread until the operation is done or the
  timeout passes, and raises then; in addition the process group's watchdog (asynchronous error
  handling, ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default) ends a process whose NCCL operation
  outlives the group's timeout (tpload's own world is made with the load's timeout; a caller's
  group has the caller's), so a rank stuck in a kernel that waits for a dead peer ends too, with
  the watchdog's message if it comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from .world import DistContext


def device_wire(backend: str, device: torch.device, *, shared_device: bool = False) -> bool:
    """Whether messages go as device tensors over the load's group: a CUDA load whose group's
    backend (``dist.get_backend``: ``nccl``, ``cpu:gloo,cuda:nccl``, ``gloo``) includes NCCL,
    unless several ranks share the device (``--allow-shared-device``: NCCL refuses two ranks on one
    GPU)."""
    return device.type == "cuda" and not shared_device and "nccl" in backend.lower()


@dataclass(frozen=True)
class Wire:
    """Where the replicas' messages travel: ``group`` and ``device`` (``staged``: wire buffers are
    their own memory, with a copy on each side of a transfer; only a device wire needs it, and a
    test may ask for it on the CPU to run the same code)."""

    group: dist.ProcessGroup
    device: torch.device
    staged: bool = False

    @classmethod
    def of(cls, ctx: DistContext) -> Wire:
        """The load's wire: its device over its group when that has NCCL, else host tensors over
        its CPU group."""
        # only a CUDA load asks its group's backend (a CPU load's group may be any object)
        if ctx.device.type == "cuda" and device_wire(
            dist.get_backend(ctx.group), ctx.device, shared_device=ctx.shared_device
        ):
            return cls(ctx.group, ctx.device, staged=True)
        return cls(ctx.cpu_group, torch.device("cpu"))

    def header(self, words: list[int] | None = None, size: int = 8) -> torch.Tensor:
        """A message header: int64 words on the wire's device (zeros to receive into)."""
        if words is None:
            return torch.zeros(size, dtype=torch.int64, device=self.device)
        return torch.tensor(words, dtype=torch.int64, device=self.device)

    def host(self, nbytes: int) -> np.ndarray:
        """A host buffer of the ring (pinned beside a CUDA wire, so its copies run at full rate)."""
        pinned = self.staged and self.device.type == "cuda"
        host: np.ndarray = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).numpy()
        return host

    def buffer(self, host: np.ndarray) -> torch.Tensor:
        """The wire buffer beside ``host``: ``host`` itself on the CPU, else device memory of its
        size."""
        if not self.staged:
            return torch.from_numpy(host)
        return torch.empty(host.size, dtype=torch.uint8, device=self.device)

    def put(self, host: np.ndarray, wire: torch.Tensor) -> torch.Tensor:
        """What to send for the host bytes ``host`` (a prefix of the buffer ``wire`` stands
        beside): the same memory on the CPU, else a copy in ``wire``."""
        out = wire[: host.size]
        if self.staged:
            out.copy_(torch.from_numpy(host))
        return out

    def take(self, wire: torch.Tensor, host: np.ndarray) -> None:
        """The received ``wire`` bytes into ``host`` (nothing to do when they are one memory)."""
        if self.staged:
            torch.from_numpy(host).copy_(wire[: host.size])

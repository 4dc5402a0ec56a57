"""The distributed context of one rank, and the one collective a load makes.

``init_distributed`` is for processes that tpload itself starts (``torchrun
-m tpload``); ``context`` wraps a world some serving startup already made.
Either way a load makes exactly one collective, :func:`exchange`, at the
very end: every rank, failed or not, arrives there with its figures and
status, so no rank waits for a peer that already gave up.
"""

from __future__ import annotations

import atexit
import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import LoadError


@dataclass(frozen=True)
class DistContext:
    """Where this rank stands: its place in the load's group and its device."""

    rank: int
    """Rank inside the load's group (the tensor-/expert-parallel position)."""
    world: int
    """Size of the load's group."""
    local_rank: int
    """Rank on this node (LOCAL_RANK): it picks the device, never the global rank."""
    device: torch.device
    """Where this rank's weights go."""
    group: dist.ProcessGroup | None
    """The process group of the exchange; None for a single process."""
    nodes: tuple[int, ...]
    """Node id of every group rank (global rank // LOCAL_WORLD_SIZE)."""

    @property
    def node_peers(self) -> list[int]:
        """Group ranks on this rank's node, this one included."""
        return [r for r, n in enumerate(self.nodes) if n == self.nodes[self.rank]]


def default_device(local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        raise LoadError(f"environment variable {name}={raw!r} is not an integer") from None


def context(group: dist.ProcessGroup | None = None, device: str | torch.device | None = None) -> DistContext:
    """The context of an already-initialized world (or a single process when there is none)."""
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = torch.device(device) if device is not None else default_device(local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise LoadError("group= was given but torch.distributed is not initialized")
        return DistContext(0, 1, local_rank, dev, None, (0,))
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    per_node = _env_int("LOCAL_WORLD_SIZE", 0)
    globals_ = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    # Without LOCAL_WORLD_SIZE we cannot tell who shares a node: every rank is its own
    # node, which makes node verification fall back to the (safe) per-rank hashing.
    nodes = tuple(g // per_node if per_node > 0 else g for g in globals_)
    return DistContext(rank, world, local_rank, dev, group or dist.group.WORLD, nodes)


def init_world(*, device: str | torch.device | None = None, timeout_s: float = 600.0) -> bool:
    """Init the default group from RANK/WORLD_SIZE/LOCAL_RANK (nccl on CUDA, gloo on CPU)
    when torchrun started us and nobody did yet; True if this call created it."""
    if _env_int("WORLD_SIZE", 1) <= 1 or dist.is_initialized():
        return False
    dev = torch.device(device) if device is not None else default_device(_env_int("LOCAL_RANK", 0))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=dev if dev.type == "cuda" else None)
    return True


def keep_world(*, device: str | torch.device | None = None, timeout_s: float = 600.0) -> None:
    """Like :func:`init_world`, but the group stays for the life of the process.

    For ``load()`` called by a plain torchrun worker: re-creating a default group
    on torchrun's store after destroying it can hang, so a second load must
    find the first one's group. It is destroyed at exit.
    """
    if init_world(device=device, timeout_s=timeout_s):
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


@contextmanager
def init_distributed(*, device: str | torch.device | None = None, timeout_s: float = 600.0) -> Iterator[DistContext]:
    """Init the default group (see :func:`init_world`), yield this rank's context,
    and tear the group down again in ``finally`` if this call made it."""
    created = init_world(device=device, timeout_s=timeout_s)
    try:
        yield context(None, device)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


class Arrivals:
    """Marks in the rendezvous store of who reached the final exchange.

    When a peer dies (SIGKILL, OOM killer) the survivors' collective fails
    without saying who is gone; these marks let them name it. The store is
    torchrun's (MASTER_ADDR/MASTER_PORT); without one, nobody is named.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx, self.store = ctx, self._connect()
        gid = "-".join(str(r) for r in (dist.get_process_group_ranks(ctx.group) if ctx.group else [0]))
        self.prefix = f"tpload/{gid}"
        if self.store is not None:  # per-rank load count: ranks run the same loads in the same order
            self.prefix += f"/{self.store.add(f'{self.prefix}/loads/{ctx.rank}', 1)}"

    @staticmethod
    def _connect() -> dist.Store | None:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            return None
        try:
            return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=10),
                                 wait_for_workers=False)
        except (RuntimeError, ValueError, OSError):
            return None

    def arrive(self) -> None:
        if self.store is not None:
            self.store.set(f"{self.prefix}/arrived/{self.ctx.rank}", "1")

    def missing(self) -> list[int]:
        if self.store is None:
            return []
        try:
            return [r for r in range(self.ctx.world) if not self.store.check([f"{self.prefix}/arrived/{r}"])]
        except (RuntimeError, OSError):  # the store may be gone with the launcher
            return []


def exchange(row: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """All-reduce every rank's int64 row into a ``[world, K]`` table held by every rank.

    One collective for everything (figures, digest, status, message); each
    rank fills only its own row, so a SUM reduction is a gather.
    """
    table = torch.zeros(ctx.world, row.numel(), dtype=torch.int64)
    table[ctx.rank] = row
    if ctx.group is None:
        return table
    arrivals = Arrivals(ctx)
    arrivals.arrive()
    comm = table.to(ctx.device) if dist.get_backend(ctx.group) == "nccl" else table
    try:
        dist.all_reduce(comm, op=dist.ReduceOp.SUM, group=ctx.group)
    except Exception as e:  # a peer died or timed out; torch raises several types here
        gone = arrivals.missing()
        who = (f"rank {', '.join(map(str, gone))} never reached it (died or hung)" if gone
               else "a peer died or hung before reaching it")
        raise LoadError(f"rank {ctx.rank}: lost the other ranks in the final exchange: {who} "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return comm.cpu()

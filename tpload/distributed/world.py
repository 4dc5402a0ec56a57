"""Where one rank stands: its place in the load's group, its device, its node, and its groups.

``init_distributed`` is for processes that tpload itself starts (``torchrun -m tpload``): it
makes the default group with a CPU backend beside the device's (``cpu:gloo,cuda:nccl``), so the
one exchange always runs on the CPU (gloo), whatever the weights' device; ``call_world`` makes
that group for one ``load()`` under torchrun when there is none, and destroys it before the call
returns; ``context`` wraps a world some serving startup already made (its group, and its CPU group
for the exchange). The device comes from ``LOCAL_RANK`` (never the global rank), and two ranks are
never put on one GPU by accident.
"""

from __future__ import annotations

import datetime
import itertools
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..model.errors import LoadError, OptionsError
from ..model.text import escape_name
from .torch_private import has_cpu_backend


@dataclass(frozen=True)
class DistContext:
    """Where this rank stands: its place in the load's group, its device, its node."""

    rank: int
    """Rank inside the load's group (the tensor-/expert-parallel position)."""
    world: int
    """Size of the load's group."""
    local_rank: int
    """Rank on this node (LOCAL_RANK): it picks the device, never the global rank."""
    device: torch.device
    """Where this rank's weights go."""
    group: dist.ProcessGroup | None
    """The load's process group; None for a single process."""
    cpu_group: dist.ProcessGroup | None
    """The group the exchange runs on: a CPU (gloo) backend, so its failures are gloo's on any
    device."""
    nodes: tuple[int, ...] = (0,)
    """Node id of every group rank (filled in by
    :func:`tpload.distributed.exchange.share_nodes`)."""
    shared_device: bool = False
    """Several ranks of this node load onto this one device (``allow_shared_device``)."""
    store: bool = True
    """Whether the collectives' arrival marks (exchange.py's ``Arrivals``) may stay in the default
    rendezvous store. False for a refresh: its group lives in an engine's process, whose store is
    the engine's, so each rank removes its mark once the collective completed (a round a step
    leaves no key there), and a rank lost before a collective is still named by the others."""

    @property
    def node_peers(self) -> list[int]:
        """Group ranks on this rank's node, this one included."""
        return [r for r, n in enumerate(self.nodes) if n == self.nodes[self.rank]]

    @property
    def node_lists(self) -> list[list[int]]:
        """The group's ranks, node by node."""
        out: dict[int, list[int]] = {}
        for r, n in enumerate(self.nodes):
            out.setdefault(n, []).append(r)
        return list(out.values())


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        raise LoadError(
            f"environment variable {name}={escape_name(raw)!r} is not an integer"
        ) from None


def pick_device(
    device: str | torch.device | None, local_rank: int, *, allow_shared: bool = False
) -> torch.device:
    """The load's device: the one asked for (checked), or cuda:LOCAL_RANK, or the CPU without CUDA.

    Refused with a message: a device torch does not know, ``meta`` (holds no data), a GPU this
    process cannot see, and a LOCAL_RANK beyond the GPUs (two ranks would share one) unless
    ``allow_shared``.
    """
    cuda = torch.cuda.is_available()
    if device is None:
        if not cuda:
            return torch.device("cpu")
        count = torch.cuda.device_count()
        if local_rank >= count and not allow_shared:
            raise OptionsError(
                f"LOCAL_RANK {local_rank} has no GPU of its own ({count} visible): more ranks than "
                "GPUs on this node would share devices; start one rank per GPU, or pass "
                "--allow-shared-device for functional checks (gloo only: NCCL refuses it)"
            )
        return torch.device("cuda", local_rank % count)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionsError(
            f"device {escape_name(device)!r} is not a device (expected cpu, cuda or cuda:N)"
        ) from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise OptionsError(
            f"device {escape_name(device)!r}: tpload loads onto cpu or cuda, not {dev.type}"
            + (" (a meta tensor holds no data)" if dev.type == "meta" else "")
        )
    if not cuda:
        raise OptionsError(
            f"device {escape_name(device)!r} asked for, but this process sees no CUDA device "
            f"(torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    index = local_rank if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise OptionsError(
            f"device cuda:{index} asked for, but this process sees "
            f"{torch.cuda.device_count()} GPU(s)"
        )
    return torch.device("cuda", index)


def init_world(*, timeout_s: float) -> bool:
    """Init the default group from RANK/WORLD_SIZE/MASTER_* when torchrun started us and nobody did
    yet; True if this call created it. A world that cannot form within ``timeout_s`` is a LoadError.

    With CUDA the group has both backends (``cpu:gloo,cuda:nccl``): tpload's exchange runs on gloo,
    and NCCL is there, created lazily (no device_id, so no collective at init), for whatever the
    process does next. Every rank makes the same group, whatever its device turns out to be.
    """
    if env_int("WORLD_SIZE", 1) <= 1 or dist.is_initialized():
        return False
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except (
        RuntimeError,
        ValueError,
        OSError,
    ) as e:  # a peer that never came, a port in use, a store timeout
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LoadError(
            f"rank {os.environ.get('RANK', '?')}: could not form the process group of "
            f"{os.environ.get('WORLD_SIZE')} ranks within {timeout_s:g} s ({escape_name(first)})"
        ) from None
    return True


_CALL_WORLDS = itertools.count(1)
"""How many call-scoped worlds this process made: each one's keys in the rendezvous store get their
own prefix. A counter, not a cache: every rank makes the same calls, so the numbers agree."""


@contextmanager
def call_world(*, timeout_s: float) -> Iterator[None]:
    """For one ``load()`` under torchrun when nobody made a world: the default group for this call
    only, destroyed in ``finally`` (whoever makes a group tears it down; a caller's group is the
    caller's). Nothing is left behind, no exit hook either.

    Re-creating the default group on torchrun's store reads the last group's stale keys (a slow peer
    makes gloo connect to a closed port), so each call's group has its own prefix in the store
    (``tpload/world/N``). That needs torchrun's agent to hold the store: a launcher whose rank 0
    hosts it would close the store under a faster peer's next call, so there the caller inits.
    """
    world = env_int("WORLD_SIZE", 1)
    if world <= 1 or dist.is_initialized():
        yield
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise OptionsError(
            f"WORLD_SIZE={world} but no process group, and no torchrun agent holds the store: "
            "init torch.distributed (init_process_group) before load(), or start under torchrun"
        )
    rank, number = env_int("RANK", 0), next(_CALL_WORLDS)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        store = dist.PrefixStore(f"tpload/world/{number}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    except (RuntimeError, ValueError, OSError) as e:  # a peer that never came, a store timeout
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LoadError(
            f"rank {rank}: could not form the process group of {world} ranks within "
            f"{timeout_s:g} s ({escape_name(first)})"
        ) from None
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _cpu_group_of(
    group: dist.ProcessGroup | None, cpu_group: dist.ProcessGroup | None
) -> dist.ProcessGroup | None:
    """The group the exchange runs on: the caller's CPU group, or the load's group if it has a CPU
    backend."""
    if cpu_group is not None:
        return cpu_group
    g = group or dist.group.WORLD
    if has_cpu_backend(g):  # gloo, or cpu:gloo,cuda:nccl
        return g
    raise OptionsError(
        "the process group has no CPU backend (NCCL only): pass cpu_group= (a gloo group over "
        "the same ranks; vLLM has get_tp_group().cpu_group) so the exchange cannot hang in NCCL"
    )


def context(
    group: dist.ProcessGroup | None = None,
    cpu_group: dist.ProcessGroup | None = None,
    *,
    device: torch.device | None = None,
) -> DistContext:
    """The context of an already-initialized world (or a single process when there is none); the
    device (default: the CPU, until the caller picks one with :func:`with_device`)."""
    local_rank = env_int("LOCAL_RANK", 0)
    device = device or torch.device("cpu")
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None or cpu_group is not None:
            raise OptionsError("group= was given but torch.distributed is not initialized")
        return DistContext(0, 1, local_rank, device, None, None)
    g = group or dist.group.WORLD
    rank, world = dist.get_rank(g), dist.get_world_size(g)
    if rank < 0:
        raise OptionsError(
            f"this process (global rank {dist.get_rank()}) is not a member of the group it was "
            "given"
        )
    cg = _cpu_group_of(group, cpu_group)
    if dist.get_world_size(cg) != world or dist.get_rank(cg) != rank:
        raise OptionsError(
            f"cpu_group= has {dist.get_world_size(cg)} ranks with this one at {dist.get_rank(cg)}; "
            f"it must match group= ({world} ranks, this one at {rank})"
        )
    return DistContext(rank, world, local_rank, device, g, cg)


def with_device(ctx: DistContext, device: torch.device, *, shared: bool = False) -> DistContext:
    """``ctx`` on ``device`` (made the current CUDA device)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return replace(ctx, device=device, shared_device=shared)


def node_key() -> str:
    """What names this rank's node: TPLOAD_NODE_ID when set, else the host name and torchrun's
    GROUP_RANK (its agent: several agents on one host are several nodes to torchrun)."""
    override = os.environ.get("TPLOAD_NODE_ID")
    if override:
        return f"id:{override}"
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '')}"


@contextmanager
def init_distributed(*, timeout_s: float = 600.0) -> Iterator[DistContext]:
    """Init the default group (``cpu:gloo,cuda:nccl`` with CUDA, ``gloo`` without), yield this
    rank's context (its device is picked by the load, from LOCAL_RANK), and tear the group down in
    ``finally`` if this call made it."""
    created = init_world(timeout_s=timeout_s)
    try:
        yield context()
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()

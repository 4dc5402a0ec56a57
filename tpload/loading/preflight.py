"""OOM pre-flight: refuse a load that cannot fit before any byte is copied.

A load that runs out of device memory half way has read gigabytes for
nothing, and on a unified-memory machine it can take the host down with it.
Each rank compares what its plan will allocate (the arena plus the largest
transient) with the free memory of its device minus a reserve the caller
keeps for what runs after the load (KV cache, activations). On the CPU every
rank of the node allocates from the same RAM, so the node's plans are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from ..model.errors import LoadError
from ..model.values import Layout
from ..planning.planner import Planner, RankPlan

GIB = 1 << 30


@dataclass(frozen=True)
class Need:
    """What the ranks sharing one device will allocate on it."""

    arena: int
    """Bytes of served tensors (one arena per rank)."""
    transient: int
    """Largest staging and decode buffers beyond the arenas."""
    ranks: int
    """How many ranks share the device (the node's ranks on the CPU, else 1)."""

    @property
    def total(self) -> int:
        return self.arena + self.transient


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device``: the CUDA driver's count, or the host's available memory."""
    if device.type == "cuda":
        free: int = torch.cuda.mem_get_info(device)[0]
        return free
    available: int = psutil.virtual_memory().available
    return available


def need(plans: list[RankPlan], *, beyond: int = 0) -> Need:
    """What ``plans`` (the ranks sharing a device) allocate on it; ``beyond``: bytes each rank
    holds beyond its plan (the replicas' device ring)."""
    return Need(
        sum(p.arena_bytes for p in plans),
        sum(p.largest_transient for p in plans) + beyond * len(plans),
        len(plans),
    )


def check(
    planner: Planner,
    layout: Layout,
    plan: RankPlan,
    device: torch.device,
    sharing: list[RankPlan],
    reserve_bytes: int,
    *,
    beyond: int = 0,
) -> None:
    """Raise a LoadError with the numbers and what to change if ``plan`` will not fit; ``sharing``:
    the plans of every rank allocating from the same memory (this one included): the node's ranks
    on the CPU, or the ranks sharing one GPU; ``beyond``: device bytes the load holds beside the
    plans (the replicas' wire rings, distributed/placement.py's ``wire_device_bytes``)."""
    sharing = sharing or [plan]
    needs = need(sharing, beyond=beyond)
    free = free_bytes(device)
    if needs.total <= free - reserve_bytes:
        return
    raise LoadError(_message(planner, layout, plan, device, sharing, needs, free, reserve_bytes))


def _message(
    planner: Planner,
    layout: Layout,
    plan: RankPlan,
    device: torch.device,
    sharing: list[RankPlan],
    needs: Need,
    free: int,
    reserve: int,
) -> str:
    who = f"the {needs.ranks} ranks of this node need" if needs.ranks > 1 else "this rank needs"
    head = (
        f"out of memory before the load: {who} {needs.total / GIB:.2f} GiB on {device} (arena "
        f"{needs.arena / GIB:.2f} GiB + largest transient {needs.transient / GIB:.2f} GiB), free "
        f"{free / GIB:.2f} GiB - reserve {reserve / GIB:.2f} GiB = {(free - reserve) / GIB:.2f} "
        "GiB usable"
    )
    advice = [
        f"more ranks: a larger tp x ep (now tp {layout.tp} x ep {layout.ep}) spreads the bytes "
        "thinner"
    ]
    if planner.expert_counts:
        advice.append(f"--ep {layout.ep * 2} (with 2x the ranks) halves each rank's routed experts")
    if plan.kind == "expanded":
        packed = need([planner.plan(layout, "packed", p.rank) for p in sharing])
        advice.append(f"--kind packed needs {packed.total / GIB:.2f} GiB (FP4/FP8 stay as stored)")
    if reserve:
        advice.append("a smaller --reserve-gib")
    return head + "; to fit: " + "; or ".join(advice)

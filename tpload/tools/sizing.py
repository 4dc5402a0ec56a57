"""What a layout costs before anything is read: each rank's reads, hashing and memory, and each
node's, from the plans alone (``tpload plan``; headers-only full-size checkpoints too).

Node verification splits each node's tensors among the ranks that read them (policy.py), so a
node hashes what its ranks read, once. A hub snapshot is checked by whole files instead
(files.py), so a node hashes every file any of its ranks touches: under expert parallelism that
is more than it reads, and the figures say by how much.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import psutil

from ..loading.planner import planner_of
from ..model.text import plural
from ..model.values import Layout
from ..planning.planner import Planner, RankPlan
from ..selection.config import Config
from ..storage.catalogue import Catalogue
from ..storage.open import open_storage
from ..storage.reader import CHUNK_BYTES as READER_CHUNK_BYTES
from ..storage.reader import RING as READER_RING
from ..transfer.base import CUDA_CHUNK_BYTES
from ..verification.node import assign_hashing, readers

GIB = 1 << 30

STAGING_BYTES = READER_RING * READER_CHUNK_BYTES
"""Host staging per rank: the reader's ring of private buffers."""
PINNED_BYTES = 2 * CUDA_CHUNK_BYTES
"""Host pinned memory per rank on CUDA: the transfer's two buffers."""


@dataclass(frozen=True)
class RankCost:
    rank: int
    node: int
    tensors: int
    read_bytes: int
    hash_bytes: int
    """Bytes this rank hashes under node verification with a per-tensor manifest."""
    arena_bytes: int
    transient_bytes: int

    @property
    def device_peak(self) -> int:
        return self.arena_bytes + self.transient_bytes


@dataclass(frozen=True)
class NodeCost:
    node: int
    ranks: tuple[int, ...]
    read_bytes: int
    hash_bytes: int
    """Per-tensor manifest: each tensor its ranks read, hashed once."""
    file_bytes: int | None
    """Hub snapshot: every file its ranks touch, hashed whole (None for an export's rank files)."""


def costs(
    plans: Sequence[RankPlan], catalogue: Catalogue, nproc_per_node: int
) -> tuple[list[RankCost], list[NodeCost]]:
    """Every rank's and every node's figures; ranks fill nodes in order (torchrun's assignment)."""
    nodes = [
        list(range(k, min(k + nproc_per_node, len(plans))))
        for k in range(0, len(plans), nproc_per_node)
    ]
    tensors = catalogue.tensors
    ranks: list[RankCost] = []
    node_costs: list[NodeCost] = []
    for node, members in enumerate(nodes):
        users = readers({r: plans[r].reads for r in members})
        sizes = {n: tensors[n].nbytes for n in users}
        split = assign_hashing(sizes, members, users)
        files = {tensors[n].file for n in users}
        for r in members:
            p = plans[r]
            ranks.append(
                RankCost(
                    r,
                    node,
                    p.served,
                    p.read_bytes,
                    sum(sizes[n] for n in split[r]),
                    p.arena_bytes,
                    p.largest_transient,
                )
            )
        node_costs.append(
            NodeCost(
                node,
                tuple(members),
                sum(plans[r].read_bytes for r in members),
                sum(sizes.values()),
                _file_bytes(catalogue, files),
            )
        )
    return ranks, node_costs


@contextlib.contextmanager
def planning(root: str | os.PathLike[str], config: Config, layout: Layout) -> Iterator[Planner]:
    """An offline planner of ``root`` (its storage closed once the tensors are classified), the
    layout checked."""
    storage = open_storage(root, tp=layout.tp, ep=layout.ep, rank=0, world=layout.world)
    try:
        planner = planner_of(storage.catalogue, config)  # the header or config.json it read
    finally:
        storage.close()
    planner.check_layout(layout, layout.world)
    yield planner


def _file_bytes(catalogue: Catalogue, files: set[str]) -> int | None:
    paths = [catalogue.root / f for f in files]
    return sum(os.path.getsize(p) for p in paths) if all(p.is_file() for p in paths) else None


class HostMemory:
    """This process's resident memory at the steps of planning: what a rank holds besides its
    staging (the interpreter and imports, the catalogue and classification, its plans)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.start = self._rss()
        self.catalogue = self.per_plan = 0

    def _rss(self) -> int:
        rss: int = self._proc.memory_info().rss
        return rss

    def classified(self) -> None:
        self.catalogue = self._rss() - self.start

    def planned(self, count: int) -> None:
        self.per_plan = max(0, self._rss() - self.start - self.catalogue) // max(1, count)

    @property
    def peak(self) -> int:
        """Peak RSS of the process so far (Linux reports KiB)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def render_costs(
    ranks: list[RankCost],
    nodes: list[NodeCost],
    digests: Sequence[str],
    host: HostMemory,
    *,
    every_rank: bool,
    headers_only: bool = False,
    fit: str | None = None,
) -> str:
    """The table ``tpload plan`` prints: each rank (or only the busiest of each node), then each
    node. In the load table's units: bytes moved in GB, memory in GiB; ``fit``: the verdict against
    a GPU's memory (:func:`fit_line`), under the device peak."""
    gb: Callable[[float], str] = lambda b: f"{b / 1e9:.3f}"  # noqa: E731
    gib: Callable[[float], str] = lambda b: f"{b / GIB:.3f}"  # noqa: E731
    lines = [
        f"{'rank':>5} {'node':>4} {'tensors':>8} {'read GB':>9} {'hash GB':>9} {'device GiB':>10} "
        f"{'transient GiB':>13} {'peak dev GiB':>12}  digest"
    ]
    shown = (
        ranks
        if every_rank
        else [
            max((r for r in ranks if r.node == n.node), key=lambda r: r.device_peak) for n in nodes
        ]
    )
    for r in shown:
        lines.append(
            f"{r.rank:>5} {r.node:>4} {r.tensors:>8} {gb(r.read_bytes):>9} {gb(r.hash_bytes):>9} "
            f"{gib(r.arena_bytes):>10} {gib(r.transient_bytes):>13} {gib(r.device_peak):>12}  "
            f"{digests[r.rank]}"
        )
    if not every_rank:
        lines.append(
            "(the rank of each node with the highest device peak; --ranks all lists every rank)"
        )
    lines.append(
        f"{'node':>5} {'ranks':>9} {'read GB':>9} {'hash GB':>9} {'whole-file hash GB':>19}"
    )
    for n in nodes:
        whole = "-" if n.file_bytes is None else gb(n.file_bytes)
        if n.file_bytes and n.hash_bytes and n.file_bytes > 1.05 * n.hash_bytes:
            whole += f" ({n.file_bytes / n.hash_bytes:.1f}x)"
        lines.append(
            f"{n.node:>5} {f'{n.ranks[0]}-{n.ranks[-1]}':>9} {gb(n.read_bytes):>9} "
            f"{gb(n.hash_bytes):>9} {whole:>19}"
        )
    top = max(ranks, key=lambda r: r.device_peak)
    peers = max(len(n.ranks) for n in nodes)
    held = host.start + host.catalogue + peers * host.per_plan + STAGING_BYTES + PINNED_BYTES
    lines.append(
        f"peak device memory {gib(top.device_peak)} GiB (rank {top.rank}: arena "
        f"{gib(top.arena_bytes)} GiB, one staged window and its decode "
        f"{gib(top.transient_bytes)} GiB)"
    )
    if fit:
        lines.append(fit)
    lines.append(
        f"peak host memory about {gib(held)} GiB a rank: imports {gib(host.start)}, catalogue and "
        f"classification {gib(host.catalogue)}, its node's {plural(peers, 'plan')} "
        f"{gib(peers * host.per_plan)}, read ring {gib(STAGING_BYTES)}, pinned (CUDA) "
        f"{gib(PINNED_BYTES)} (GiB, measured in this process; the page cache is the kernel's)"
    )
    lines.append(
        "hash GB: node verification with a per-tensor manifest (each tensor once per node); "
        "whole-file: a hub snapshot checked by blob sha256 (every file a node's ranks touch)"
    )
    if headers_only:
        lines.append(
            "headers-only checkpoint: these are the plans of the real sizes; loading it is refused"
        )
    return "\n".join(lines)


def fit_line(ranks: Sequence[RankCost], gpu_bytes: int, source: str) -> str:
    """Whether every rank's device peak fits a GPU of ``gpu_bytes`` (``source``: where that size
    came from), with the margin of the busiest rank: the room left, or how far over it is."""
    top = max(ranks, key=lambda r: r.device_peak)
    over = [r for r in ranks if r.device_peak > gpu_bytes]
    size = f"a GPU of {gpu_bytes / GIB:.2f} GiB ({source})"
    peak = f"{top.device_peak / GIB:.3f} GiB"
    if not over:
        return (
            f"fits {size}: the highest peak, rank {top.rank}'s {peak}, leaves "
            f"{(gpu_bytes - top.device_peak) / GIB:.3f} GiB (a load's pre-flight checks the "
            "device's free memory less --reserve-gib)"
        )
    return (
        f"does not fit {size}: {len(over)} of {plural(len(ranks), 'rank')} peak above it, rank "
        f"{top.rank} at {peak}, {(top.device_peak - gpu_bytes) / GIB:.3f} GiB over; more ranks "
        "(a larger tp x ep) spread the bytes thinner"
    )

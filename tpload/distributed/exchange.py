"""The two collectives a load makes, and the rendezvous-store marks around them.

Every rank, failed or not, arrives at :func:`handshake` and then at :func:`exchange` exactly once
per ``load()`` call, each time with one int64 row; a SUM all-reduce of rows each rank filled
alone is an all-gather, so afterwards every rank holds every row. The handshake (before the copy
loop: agreement.py) carries each rank's status and what it is about to load; the exchange (after
it) its figures, status and evidence, from which every rank reaches the same verdict. Both run on
the context's CPU group (gloo), with a deadline. The only other collective, :func:`agree`,
follows a passed verdict when rank 0 writes the load attestation, so that a failed write fails
every rank.

Rows carry the call's sequence number: a process that calls ``load()`` again
after a call that failed elsewhere cannot meet another call's rows unnoticed.

Before planning, ranks leave their tpload's stamp and their node's name in the rendezvous store
(:func:`share_nodes`: ranks of other tploads are named there, before any collective); before each
collective, an arrival mark, so survivors can name a rank that died (SIGKILL, the OOM killer)
instead of only timing out.
"""

from __future__ import annotations

import datetime
import os
import threading
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist

from ..model.errors import LoadError
from ..model.text import escape_name
from . import versions
from .torch_private import default_store
from .world import DistContext, node_key


class _Calls:
    """How many loads this process started in each group (the per-call sequence number). Only the
    count lives here; it starts empty, and nothing else is kept between calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def next(self, group: str) -> int:
        with self._lock:
            self._counts[group] = self._counts.get(group, 0) + 1
            return self._counts[group]


CALLS = _Calls()


def group_id(ctx: DistContext) -> str:
    """The load's group by its global ranks (the same string on every member)."""
    if ctx.group is None:
        return "0"
    return "-".join(map(str, dist.get_process_group_ranks(ctx.group)))


def _store() -> dist.Store | None:
    """The world's rendezvous store (it outlives a dead rank: torchrun's agent holds it)."""
    store = default_store()
    if store is not None:
        return store
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        return dist.TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=datetime.timedelta(seconds=10),
            wait_for_workers=False,
        )
    except (RuntimeError, ValueError, OSError):
        return None


def share_nodes(ctx: DistContext, seq: int, timeout_s: float) -> tuple[DistContext, str]:
    """``ctx`` with every group rank's node id, from the names ranks leave in the rendezvous store
    (no collective), once every rank is known to run this tpload (versions.py: raises
    :class:`~.versions.Incompatible` naming the ranks that do not); and a note when nodes could
    not be told apart (then each rank is its own node, which makes node verification hash per
    rank: slower, never less safe)."""
    if ctx.group is None:
        return ctx, ""
    store = _store()
    prefix = f"tpload/{group_id(ctx)}/{seq}/node"
    if store is None:
        return replace(
            ctx, nodes=tuple(range(ctx.world))
        ), "no rendezvous store: every rank hashed as its own node"
    stamped = f"tpload/{group_id(ctx)}/{seq}/version"
    try:
        # the stamp before the node name: a peer whose name is there has its stamp there too
        store.set(f"{stamped}/{ctx.rank}", versions.stamp())
        store.set(f"{prefix}/{ctx.rank}", node_key())
        keys = [f"{prefix}/{r}" for r in range(ctx.world)]
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        names = [store.get(k).decode(errors="replace") for k in keys]
        stamps = [
            store.get(k).decode(errors="replace") if store.check([k]) else None
            for k in (f"{stamped}/{r}" for r in range(ctx.world))
        ]
    except (RuntimeError, OSError) as e:  # a peer that never came, or the store gone
        raise LoadError(
            f"rank {ctx.rank}: the other ranks did not all start this load within {timeout_s:g} s "
            f"({escape_name(str(e).splitlines()[0] if str(e) else type(e).__name__)})"
        ) from None
    other = versions.mismatch(ctx.rank, stamps)  # before any collective: rows may not fit
    if other is not None:
        raise other
    ids: dict[str, int] = {}
    return replace(ctx, nodes=tuple(ids.setdefault(n, len(ids)) for n in names)), ""


class Arrivals:
    """Marks in the rendezvous store of who reached one of the load's collectives (``mark``)."""

    def __init__(self, ctx: DistContext, seq: int, mark: str = "arrived") -> None:
        self.ctx, self.store = ctx, _store()
        self.prefix = f"tpload/{group_id(ctx)}/{seq}/{mark}"
        self.tidy = not ctx.store
        """Remove this rank's mark once the collective completed (a store that is not ours)."""

    def arrive(self) -> None:
        if self.store is not None:
            try:
                self.store.set(f"{self.prefix}/{self.ctx.rank}", "1")
            except (RuntimeError, OSError):
                self.store = None

    def leave(self) -> None:
        """The collective completed: this rank's mark goes, where the store is not ours."""
        if self.store is not None and self.tidy:
            try:
                self.store.delete_key(f"{self.prefix}/{self.ctx.rank}")
            except (RuntimeError, OSError):
                self.store = None

    def missing(self) -> list[int]:
        if self.store is None:
            return []
        try:
            return [
                r for r in range(self.ctx.world) if not self.store.check([f"{self.prefix}/{r}"])
            ]
        except (RuntimeError, OSError):  # the store may be gone with the launcher
            return []


class Flags:
    """Values ranks leave in the rendezvous store for their peers to read without a collective: a
    rank that stops its replicas' traffic says so (sources/replicas.py), so a peer busy sending to
    it stops too. Never raises: without a store (or once it is gone) nothing is said or read."""

    def __init__(self, ctx: DistContext, seq: int, name: str) -> None:
        self.store = _store() if ctx.group is not None else None
        self.prefix = f"tpload/{group_id(ctx)}/{seq}/{name}" if self.store is not None else ""

    def put(self, rank: int, value: str) -> None:
        if self.store is not None:
            try:
                self.store.set(f"{self.prefix}/{rank}", value)
            except (RuntimeError, OSError):
                self.store = None

    def get(self, rank: int) -> str | None:
        """What ``rank`` left (None: nothing)."""
        found = self.first([rank])
        return found[1] if found is not None else None

    def first(self, ranks: list[int]) -> tuple[int, str] | None:
        """The first of ``ranks`` that left a value, and the value (None: none did)."""
        store = self.store
        if store is None:
            return None
        for r in ranks:
            key = f"{self.prefix}/{r}"
            try:
                if store.check([key]):
                    return r, store.get(key).decode(errors="replace")
            except (RuntimeError, OSError):
                self.store = None
                return None
        return None


def exchange(
    row: torch.Tensor,
    ctx: DistContext,
    *,
    seq: int,
    timeout_s: float,
    step: str = "the final exchange",
) -> torch.Tensor:
    """All-reduce every rank's int64 row into a ``[world, K]`` table held by every rank.

    One collective for everything (figures, digest, status, message, evidence); each rank
    fills only its own row. Runs on the CPU group with a deadline of ``timeout_s``. ``step``: which
    collective, in an error (:func:`agree` makes the only other one).
    """
    return _all_rows(row, ctx, seq=seq, timeout_s=timeout_s, step="the final exchange")


def handshake(row: torch.Tensor, ctx: DistContext, *, seq: int, timeout_s: float) -> torch.Tensor:
    """The same for the handshake before the copy loop (agreement.py): a small row (status and
    what the rank is about to load), met once per call whatever failed before it."""
    return _all_rows(
        row,
        ctx,
        seq=seq,
        timeout_s=timeout_s,
        step="the handshake before the copy loop",
        mark="agreed",
    )


def _all_rows(
    row: torch.Tensor,
    ctx: DistContext,
    *,
    seq: int,
    timeout_s: float,
    step: str,
    mark: str = "arrived",
) -> torch.Tensor:
    table = torch.zeros(ctx.world, row.numel(), dtype=torch.int64)
    table[ctx.rank] = row
    if ctx.cpu_group is None:
        return table
    arrivals = Arrivals(ctx, seq, mark)
    arrivals.arrive()
    try:
        work = dist.all_reduce(table, op=dist.ReduceOp.SUM, group=ctx.cpu_group, async_op=True)
        if not work.wait(datetime.timedelta(seconds=timeout_s)):
            raise TimeoutError(f"no answer within {timeout_s:g} s")
    except Exception as e:  # a peer died or timed out; torch raises several types here
        gone = arrivals.missing()
        who = (
            f"rank {', '.join(map(str, gone))} never reached it (died or hung)"
            if gone
            else "a peer died or hung before reaching it"
        )
        first = str(e).splitlines()[0] if str(e) else ""
        raise LoadError(
            f"rank {ctx.rank}: lost the other ranks in {step}: {who} "
            f"({type(e).__name__}: {escape_name(first)[:300]})"
        ) from None
    arrivals.leave()
    return table


AGREE_BYTES = 4096


def agree(failure: str, ctx: DistContext, *, seq: int, timeout_s: float, step: str) -> str:
    """After a passed verdict, rank 0's outcome of a step only rank 0 runs (writing the
    attestation), learnt by every rank in one more collective: "" when it went well, else rank 0's
    one-line ``failure``. Every rank calls it or none (rank 0's row in the exchange said whether),
    so a failure there fails every rank instead of rank 0 alone."""
    raw = failure.encode()[:AGREE_BYTES].decode(errors="ignore").encode() if ctx.rank == 0 else b""
    words = torch.from_numpy(np.frombuffer(raw.ljust(AGREE_BYTES, b"\0"), dtype="<i8").copy())
    table = _all_rows(words, ctx, seq=seq, timeout_s=timeout_s, step=step, mark="attested")
    said: str = table[0].numpy().astype("<i8").tobytes().rstrip(b"\0").decode(errors="replace")
    return said

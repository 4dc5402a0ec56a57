"""One rank's load, as one fixed sequence: open, plan, pre-flight, the gate's strategy, the read
source, ``gate.prepare``, handshake, run, ``gate.settle``, exchange, verdict. Whatever fails on this
rank becomes its rows' status, so a call meets the handshake (distributed/agreement.py: every rank
loads the same thing the same way, or none copies) and the exchange exactly once each and no peer
waits; after it, the verdict is a function of the exchanged table alone, the same on every rank
(verification/gate.py owns it; the read source words what only it can judge).

The sequence never knows where windows come from: it asks sources/open.py for the read source once,
gives the gate the windows each rank reads from storage itself (the hash plan's input), runs the
loop on the source, and hands the source's own verdict lines to the gate's judge.

A storage its caller holds ready (a refresh's staging, refresh/engine.py) runs the same steps from
the gate's prepare on, through :class:`HeldLoad`: its windows arrive while its loop runs, so the
steps come in three calls (prepare and handshake; run and settle, on the caller's thread of
choice; exchange and verdict), on the caller's group, with no rendezvous store."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

from ..distributed import placement
from ..distributed.agreement import Handshake, outcome
from ..distributed.exchange import CALLS, Flags, exchange, group_id, share_nodes
from ..distributed.versions import Incompatible
from ..distributed.world import DistContext, pick_device, with_device
from ..kernels.lazy import warm
from ..model.errors import LoadError, StoodDown
from ..model.figures import RankFigures
from ..model.modes import RankStatus
from ..model.progress import ProgressSink, Silent
from ..model.text import first_line, one_line
from ..model.values import Layout
from ..options.load_options import LoadOptions
from ..planning.planner import Planner, RankPlan
from ..report.imports import first_load_imports_ns
from ..report.memory import MemoryPeaks, device_peaks, reset_device_peaks
from ..report.progress import DOING, Phases
from ..selection.config import Config
from ..sources.base import ReadSource
from ..sources.hashing import Hasher, spare_cores
from ..sources.open import open_source
from ..sources.order import read_turns
from ..sources.whole_files import FileHasher, alongside
from ..storage.base import Storage
from ..storage.open import open_storage
from ..storage.pins import plan_file_digests
from ..storage.sharded import ShardedStorage
from ..transfer.device import for_device
from ..verification import gate, signing, strategy
from ..verification.gate import Verdict, check_pin
from ..verification.node import ByteSizes
from ..verification.store import Stamp, checkpoint_stamp
from ..verification.terms import PLAN_FIELDS, Terms
from . import loop, preflight, steps
from .deferred import DeferredTensor, locate
from .planner import planner_of
from .result import LoadResult
from .shards import RankShards, failed, served
from .teardown import give_back
from .watch import Watch


class _RankLoad:
    """Everything one rank does before the exchange, for one call."""

    def __init__(
        self, opts: LoadOptions, ctx: DistContext, fig: RankFigures, sink: ProgressSink | None
    ) -> None:
        self.opts, self.ctx, self.fig, self.sink = opts, ctx, fig, sink
        self.result: LoadResult | None = None
        self.plan: RankPlan | None = None
        self.planner: Planner | None = None
        self.at: placement.Placement | None = None
        """Where each rank stands, with replicas (each rank plans its position)."""
        self.gate: strategy.Strategy | None = None
        self.source: ReadSource | None = None
        self.deferred: tuple[DeferredTensor, ...] = ()
        self.notes: list[str] = []
        self.started, self.imports_ns = time.perf_counter_ns(), first_load_imports_ns()
        self.meeting = Handshake(fig.seq, self.opts.timeout_s)
        self.phases = Phases(rank=ctx.rank)
        self.watch: Watch | None = None
        self.interrupted: str | None = None
        """The phase a Ctrl-C interrupted on this rank: after the exchange (so every peer learns
        it), this rank raises KeyboardInterrupt, not the verdict's LoadError."""

    def attempt(self, seq: int, error: LoadError | None) -> None:
        """Everything before the exchange; every failure becomes this rank's status and message,
        and the handshake is met exactly once (a rank that failed before it, with its status)."""
        fig = self.fig
        self.phases.enter("open")
        try:
            # first: peers wait for this node name
            self.ctx, note = share_nodes(self.ctx, seq, self.opts.timeout_s)
            self.notes += [note] if note else []
            fig.node = self.ctx.nodes[self.ctx.rank]
            if error is not None:
                raise error
            device = pick_device(
                self.opts.device, self.ctx.local_rank, allow_shared=self.opts.allow_shared_device
            )
            self.ctx = with_device(
                self.ctx, device, shared=self.opts.allow_shared_device and device.type == "cuda"
            )
            reset_device_peaks(device)
            layout = Layout(
                self.opts.tp
                or max(1, self.ctx.world // self.opts.ep // placement.count(self.opts)),
                self.opts.ep,
            )
            # a model.sig: its bundle and the JSON files it signs, before any is read
            self.signed = signing.precheck(self.opts, notes=self.notes)
            checkpoint = self.opts.checkpoint
            if checkpoint is None:  # load() and the command line always name one
                raise LoadError("no checkpoint to load (a bug in tpload)")
            storage = open_storage(
                checkpoint,
                tp=layout.tp,
                ep=layout.ep,
                rank=self.ctx.rank,
                world=self.ctx.world,
            )
            try:
                self._load(storage, layout)
            finally:
                storage.close()
            fig.device_alloc_peak, fig.device_reserved_peak = device_peaks(device)
        except Incompatible as e:  # ranks of other tploads: their rows may not fit a collective
            fig.failed, fig.message = outcome(self.ctx.rank, e)
            self.meeting.cannot_meet(e)
        except (Exception, KeyboardInterrupt) as e:  # a bug or an OS error too: no peer hangs
            fig.failed, fig.message = outcome(self.ctx.rank, e)
            if isinstance(e, KeyboardInterrupt):
                self.interrupted = self.phases.current
        self.meeting.unmet(fig, self.ctx)  # failed before the handshake: meet it with that

    def _load(self, storage: Storage, layout: Layout) -> None:
        """Open, plan, pre-flight, prepare, handshake, run, settle: everything up to the
        exchange."""
        opts, ctx = self.opts, self.ctx
        storage.catalogue.refuse_headers_only("loading it")
        check_pin(storage, opts.manifest_sha256)
        self.notes += storage.catalogue.check_plan_files()  # the JSON files the manifest pins
        steps.measure_cache(self.fig, storage, ctx, opts, before=True)
        self.phases.enter("plan")
        config = steps.config_of(storage, opts, ctx, self.notes)
        planner = self.planner = planner_of(storage.catalogue, config)
        # with replicas, each replica's ranks are planned as positions in its layout
        planner.check_layout(layout, placement.planned_world(opts, ctx.world, layout.tp, layout.ep))
        at = self.at = placement.placement(opts, ctx.world)  # replicas: where each rank stands
        plans, sharing = steps.node_plans(planner, layout, opts, ctx, at)
        plan = self.plan = plans[ctx.rank]
        preflight.check(
            planner,
            layout,
            plan,
            ctx.device,
            sharing,
            int(opts.reserve_gib * preflight.GIB),
            beyond=placement.wire_device_bytes(ctx.device) if at is not None else 0,
        )
        job = strategy.Job(
            opts,
            ctx,
            storage,
            plans,
            config.id(),
            layout,
            lambda: checkpoint_stamp(storage),
            self.notes,
            threads=spare_cores(len(ctx.node_peers)),
            position=at.where(ctx.rank)[1] if at else None,  # one prediction a position
            positions=at.size if at else None,
        )
        self.gate = gate.strategy(job, signed=self.signed)
        # where windows come from, chosen once: the storage, or the replica peers
        source = self.source = open_source(
            storage,
            opts=opts,
            ctx=ctx,
            plans=plans,
            planner=planner,
            layout=layout,
            kind=opts.kind,
            whole_files=self.gate.whole_files,
            seq=self.fig.seq,
        )
        # before any read: preconditions, who hashes what (over what each rank reads from storage)
        reads = source.storage_reads(plans)
        prepared = self.gate.prepare(reads, provenance=source)
        # the order this rank reads in: what it leads first, its peers' out of the page cache after
        table = storage.catalogue.table
        turns = (
            read_turns(ctx.rank, reads, ByteSizes(table.row, table.nbytes), prepared.hashes.owner)
            if source.own_order
            else None
        )
        self.fig.blake3 = int(prepared.digests.hash == "blake3")
        # every rank: the same anchor, options and files that shape the plan (pinned or not)
        cat = storage.catalogue
        used = {**cat.files_read, **(cat.pins.seen if cat.pins is not None else {})}
        shaping = plan_file_digests(storage.root, known=used, gguf_kv=cat.gguf_kv)
        terms = Terms.of(
            opts, layout, config, self.gate.anchor(), at, shaping, signature=self.gate.signature()
        )
        self.phases.enter("handshake")
        self.meeting.meet(self.fig, ctx, terms)
        self.phases.enter("read")
        # files are planned whole only for a folder vouched for file by file (a hub snapshot, a
        # local-dir download, a signed folder): a sharded one
        files = (
            FileHasher.of(cast(ShardedStorage, storage), prepared.files)
            if prepared.files is not None
            else None
        )
        with alongside(files):  # whole-file hashing on its own thread, beside the copies
            self.fig.read_started(self.started, imports_ns=self.imports_ns)  # the loop reads first
            self.result = steps.run_rank(
                storage,
                source,
                plan,
                prepared,
                opts=opts,
                ctx=ctx,
                sink=self.sink,
                phases=self.phases,
                clause=lambda: self.watch.clause if self.watch is not None else "",
                turns=turns,
            )
        steps.measure_cache(self.fig, storage, ctx, opts, before=False)
        steps.count(self.fig, self.result, plan, ctx)
        # this rank's own verdicts (raises every problem at once), and what it settled
        found = self.gate.settle(self.result, files.results if files is not None else ())
        steps.settled(self.fig, found)
        # the attestation is an exit path of the gate: rank 0's row says it will write one
        self.fig.attest = int(bool(opts.attest))
        self.deferred = locate(
            storage, self.gate.locators(plan.deferred), self.gate.locators_vouched_by
        )

    def judge(self, ranks: list[RankFigures]) -> Verdict:
        """The verdict of the exchanged table: the gate's, with what only the read source can
        judge (every rank that reaches it opened one: a rank that did not has a failed row)."""
        also = self.source.verdict(ranks) if self.source is not None else []
        return gate.judge(ranks, self.gate, also)


@dataclass(frozen=True)
class Loaded:
    """A load whose verdict passed: this rank's shards, and what the door needs to attest it
    (api.py: the attestation builds on a passed verdict, above the load)."""

    shards: RankShards
    opts: LoadOptions
    ctx: DistContext
    ranks: list[RankFigures]
    """The exchanged table."""
    planner: Planner
    at: placement.Placement | None
    """Where each rank stands, with replicas: the position each rank was planned as."""
    layout: Layout
    chosen: strategy.Strategy
    """The gate's strategy that vouched."""
    verdict: Verdict
    result: LoadResult


def load_in(
    opts: LoadOptions | None,
    ctx: DistContext,
    *,
    error: LoadError | None = None,
    progress_sink: ProgressSink | None = None,
) -> Loaded:
    """Load in an existing context (``ctx``: this rank's group, before a device is picked).
    ``error``: a problem found before the context existed, raised inside so it still reaches the
    exchange. The attestation is not this sequence's: the door writes it after (api.py)."""
    warm()  # the kernels load on a thread, beside the load's first steps
    seq = CALLS.next(group_id(ctx))
    job = _RankLoad(opts or LoadOptions(), ctx, RankFigures(rank=ctx.rank, seq=seq), progress_sink)
    t0 = time.perf_counter_ns()
    show = job.opts.progress and ctx.rank == 0 and progress_sink is None
    with Watch(job.phases, ctx, seq, show=show, publish=job.opts.progress) as job.watch:
        with MemoryPeaks() as mem:
            job.attempt(seq, error)  # never raises: whatever fails goes into this rank's row
        job.fig.ns = time.perf_counter_ns() - t0
        job.phases.enter("exchange")
        steps.timed(job.fig, job.phases)
        job.fig.rss_peak, job.fig.anon_peak = mem.rss_peak, mem.anon_peak
        job.meeting.raise_lost()  # the handshake lost the group: no exchange can follow
        problems = Flags(job.ctx, seq, "problems")  # a failed rank's message whole (the row's
        if job.fig.failed:  # is cut at 4 KiB): every rank's verdict lists every problem
            problems.put(ctx.rank, steps.bounded(job.fig.message))
        try:
            table = exchange(job.fig.to_row(), job.ctx, seq=seq, timeout_s=job.opts.timeout_s)
            ranks = [RankFigures.from_row(table[r]) for r in range(job.ctx.world)]
            verdict = job.judge(ranks)
        except KeyboardInterrupt:  # Ctrl-C while waiting for the peers' rows (or a second one:
            job.result = None  # torchrun passes on the terminal's), named by the first
            raise KeyboardInterrupt(f"while {DOING[job.interrupted or 'exchange']}") from None
    if not verdict.passed:
        job.result = None  # nothing partly loaded survives a failed load
        give_back(job.ctx.device)
        if job.interrupted is not None:  # Ctrl-C here: the peers know it, the caller sees it so
            raise KeyboardInterrupt(f"while {DOING[job.interrupted]}")
        if job.ctx.world == 1:  # alone: its own message
            whole = {job.ctx.rank: job.fig.message}
        else:  # the same on every rank: only what the store holds (nothing without one)
            failing = [r for r, f in enumerate(ranks) if f.failed]
            whole = {r: m for r in failing if (m := problems.get(r)) is not None}
        error = steps.whole_messages(verdict.error(), ranks, whole)
        failed(job.opts, job.ctx, ranks, job.notes, str(error))  # the report, when asked
        raise error
    if job.plan is None or job.result is None or job.gate is None or job.planner is None:
        # a passed row loaded
        raise LoadError("the verdict passed a rank that loaded nothing (a bug in tpload)")
    shards = served(
        job.opts,
        job.ctx,
        job.plan,
        job.result,
        job.deferred,
        ranks,
        job.notes,
        verdict,
        job.planner,
    )
    return Loaded(
        shards,
        job.opts,
        job.ctx,
        ranks,
        job.planner,
        job.at,
        job.plan.layout,
        job.gate,
        verdict,
        job.result,
    )


@dataclass
class Held:
    """What a :class:`HeldLoad` reads and who vouches for it, ready before its first read."""

    opts: LoadOptions
    """The options every rank shares (the handshake's terms carry them)."""
    storage: Storage
    source: ReadSource
    """The read source over :attr:`storage` (its reads may wait for bytes still arriving)."""
    plan: RankPlan
    config: Config
    strategy: Callable[[strategy.Job], strategy.Strategy]
    """The gate's strategy for the job (a refresh: verification/pushed.py's ``Pushed``)."""
    stamp: Callable[[], Stamp]
    """The storage's stamp now (what a stored prediction vouches for)."""
    hash_threads: int = 0
    """Hash taps on worker threads, beside the copies."""
    finite: bool = False
    """Refuse NaN and inf in floating windows (a refresh's rule: a load serves them), looked for
    in the pass that copies and fingerprints each window."""


Judge = Callable[[list[RankFigures], strategy.Strategy | None], Verdict]
"""The verdict of the exchanged table (gate.judge, or a refresh's: verification/pushed.py)."""


class HeldLoad:
    """One rank's load of a storage its caller holds ready, run by this sequence's steps from the
    gate's prepare on (see the module doc). Made once a round on every rank of ``group`` (the
    caller's CPU group: a refresh's engine ranks'; None for one rank), it meets the handshake
    (:meth:`begin`) and the exchange (:meth:`end`) exactly once each, whatever failed before.

    The rendezvous store is the engine's: the ranks' node names are not asked for (every rank is
    its own node, and a held storage is per rank: each rank hashes what it reads), and each
    collective's arrival marks are removed once it completed (a rank lost before one is named, and
    a round leaves no key).
    Every row's message is one line naming the rank as ``who`` does."""

    def __init__(
        self,
        rank: int,
        world: int,
        group: torch.distributed.ProcessGroup | None,
        *,
        who: str,
        timeout_s: float,
        judge: Judge = gate.judge,
    ) -> None:
        self.ctx = DistContext(
            rank,
            world,
            0,
            torch.device("cpu"),
            group,
            group,
            nodes=tuple(range(world)),
            store=False,
        )
        self.seq = CALLS.next(group_id(self.ctx))
        self.fig = RankFigures(rank=rank, seq=self.seq, device="cpu")
        self.meeting = Handshake(self.seq, timeout_s)
        self.who, self.timeout_s, self.judge = who, timeout_s, judge
        self.held: Held | None = None
        self.gate: strategy.Strategy | None = None
        self.prepared: strategy.Prepared | None = None
        self.result: LoadResult | None = None
        """The loop's result once the verdict passed (None before, and after a failed one)."""
        self._ran: tuple[LoadResult | None, strategy.Findings | None, str] | None = None
        self._lock = threading.Lock()

    def begin(
        self, held: Held | None, *, failed: str = "", pushed: tuple[str, int] = ("", 0)
    ) -> bool:
        """The gate's strategy and prepare over ``held``, then the handshake, met once whatever
        failed: with ``held``'s terms, or with this rank's failure (``held`` None: ``failed``, the
        caller's line). ``pushed``: the sha256 and version of the manifest this rank took, for its
        row. Never raises; True when every rank may run its loop (:meth:`run`)."""
        fig, ctx = self.fig, self.ctx
        fig.pushed_sha256, fig.pushed_version = pushed
        terms: Terms | None = None
        try:
            if held is None:
                raise LoadError(failed or "failed before the handshake")
            plans = {ctx.rank: held.plan}
            job = strategy.Job(
                held.opts,
                ctx,
                held.storage,
                plans,
                held.config.id(),
                held.plan.layout,
                held.stamp,
                threads=held.hash_threads,
            )
            self.gate = held.strategy(job)
            self.prepared = self.gate.prepare(
                held.source.storage_reads(plans), provenance=held.source
            )
            no_files = dict.fromkeys(PLAN_FIELDS, "")  # the terms' anchor is all that shapes it
            terms = Terms.of(
                held.opts, held.plan.layout, held.config, self.gate.anchor(), None, no_files
            )
            self.held = held
            self.meeting.meet(fig, ctx, terms)
            return True
        except (Exception, KeyboardInterrupt) as e:  # any failure is this rank's row: none hangs
            self.held = None
            self._fail(e, given=failed if held is None else "")
            self.meeting.unmet(fig, ctx)  # failed before the handshake: meet it with that
            return False

    def _fail(self, e: BaseException, *, given: str = "") -> None:
        status = RankStatus.STOOD_DOWN if isinstance(e, StoodDown) else RankStatus.FAILED
        if given:
            text = given
        elif isinstance(e, LoadError):
            text = f"{self.who}: {one_line(e)}"
        else:  # a bug or an OS error: named, never lost
            text = f"{self.who}: the check failed: {type(e).__name__}: {first_line(e)}"
        self.fig.failed, self.fig.message = status, text

    def run(self) -> None:
        """The copy loop over the held storage and the gate's settle, on the caller's thread
        (whose reads may wait for bytes still arriving); never raises: what it found is this
        rank's row at :meth:`end`."""
        held, prepared, chosen = self.held, self.prepared, self.gate
        if held is None or prepared is None or chosen is None:
            return
        result: LoadResult | None = None
        found: strategy.Findings | None = None
        why = ""
        try:
            hasher = Hasher(prepared.hashes, threads=held.hash_threads, digests=prepared.digests)
            result = loop.run(
                held.source,
                held.plan,
                transfer=for_device(self.ctx.device),
                hasher=hasher,
                samples=0,
                progress=Silent(),
                ranks=held.storage.catalogue.ranks(),
                finite=held.finite,
            )
            found = chosen.settle(result)
        except LoadError as e:
            result, why = None, f"{self.who}: {one_line(e)}"
        except Exception as e:  # noqa: BLE001 - reported as this rank's problem, never lost
            result = None
            why = f"{self.who}: the check failed: {type(e).__name__}: {first_line(e)}"
        with self._lock:
            self._ran = (result, found, why)

    def end(self, problem: str = "") -> Verdict:
        """The exchange and the verdict, the same on every rank: ``problem``, the caller's own
        line for this rank (it stands before the loop's), else what :meth:`run` found. Raises
        LoadError when the group was lost (in the handshake or here): no verdict can be reached."""
        fig = self.fig
        with self._lock:
            ran = self._ran
        if problem:
            fig.failed, fig.message = RankStatus.FAILED, problem
        elif self.held is not None:  # it passed the handshake: the loop's outcome is its row
            if ran is None:
                fig.failed = RankStatus.FAILED
                fig.message = f"{self.who}: the check did not finish (a bug in tpload)"
            elif ran[2]:
                fig.failed, fig.message = RankStatus.FAILED, ran[2]
            elif ran[0] is not None and ran[1] is not None:
                steps.count(fig, ran[0], self.held.plan, self.ctx)
                steps.settled(fig, ran[1])
        if self.meeting.lost is not None:  # the handshake lost the group: no exchange follows
            raise self.meeting.lost
        table = exchange(fig.to_row(), self.ctx, seq=self.seq, timeout_s=self.timeout_s)
        ranks = [RankFigures.from_row(table[r]) for r in range(self.ctx.world)]
        verdict = self.judge(ranks, self.gate)
        if verdict.passed and not fig.failed and ran is not None:
            self.result = ran[0]
        return verdict

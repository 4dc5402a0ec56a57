"""One rank's load, as one fixed sequence: open, plan, pre-flight, ``gate.prepare``, handshake, run,
``gate.settle``, exchange, verdict. Whatever fails on this rank becomes its rows' status, so a call
meets the handshake (distributed/agreement.py: every rank loads the same thing the same way, or none
copies) and the exchange exactly once each and no peer waits; after it, the verdict is a function
of the exchanged table alone, the same on every rank (verification/gate.py owns it)."""

from __future__ import annotations

import time

from ..distributed import placement
from ..distributed.agreement import Handshake, outcome
from ..distributed.exchange import CALLS, exchange, group_id, share_nodes
from ..distributed.world import DistContext, pick_device, with_device
from ..kernels.lazy import warm
from ..model.errors import LoadError
from ..model.progress import ProgressSink
from ..options.load_options import LoadOptions
from ..planning.layout import Layout
from ..planning.planner import RankPlan
from ..report.figures import RankFigures, process_first_load
from ..report.memory import MemoryPeaks, device_peaks, reset_device_peaks
from ..sources import replicas
from ..storage.base import Storage
from ..storage.open import open_storage
from ..verification import gate, signing, strategy
from ..verification.gate import check_pin, spare_cores
from ..verification.store import checkpoint_stamp
from ..verification.terms import Terms
from . import preflight, steps
from .deferred import locate
from .planner import planner_of
from .result import LoadResult
from .shards import RankShards, served
from .teardown import give_back


class _RankLoad:
    """Everything one rank does before the exchange, for one call."""

    def __init__(
        self, opts: LoadOptions, ctx: DistContext, fig: RankFigures, sink: ProgressSink | None
    ) -> None:
        self.opts, self.ctx, self.fig, self.sink = opts, ctx, fig, sink
        self.result: LoadResult | None = None
        self.plan: RankPlan | None = None
        self.gate: strategy.Strategy | None = None
        self.deferred: tuple = ()
        self.notes: list[str] = []
        self.started, self.first = time.perf_counter_ns(), process_first_load()
        self.meeting = Handshake(fig.seq, self.opts.timeout_s)

    def attempt(self, seq: int, error: LoadError | None) -> None:
        """Everything before the exchange; every failure becomes this rank's status and message,
        and the handshake is met exactly once (a rank that failed before it, with its status)."""
        fig = self.fig
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
            storage = open_storage(
                self.opts.checkpoint,
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
        except (Exception, KeyboardInterrupt) as e:  # a bug or an OS error too: no peer hangs
            fig.failed, fig.message = outcome(self.ctx.rank, e)
        self.meeting.unmet(fig, self.ctx)  # failed before the handshake: meet it with that

    def _load(self, storage: Storage, layout: Layout) -> None:
        """Open, plan, pre-flight, prepare, handshake, run, settle: everything up to the
        exchange."""
        opts, ctx = self.opts, self.ctx
        storage.catalogue.refuse_headers_only("loading it")
        check_pin(storage, opts.manifest_sha256)
        self.notes += storage.catalogue.check_plan_files()  # the JSON files the manifest pins
        steps.measure_cache(self.fig, storage, ctx, opts, before=True)
        config = steps.config_of(storage, opts, ctx, self.notes)
        planner = self.planner = placement.positions(planner_of(storage.catalogue, config), opts)
        planner.check_layout(layout, ctx.world)
        plans, sharing = steps.node_plans(planner, layout, opts, ctx)
        plan = self.plan = plans[ctx.rank]
        preflight.check(
            planner, layout, plan, ctx.device, sharing, int(opts.reserve_gib * preflight.GIB)
        )
        job = strategy.Job(
            opts,
            ctx,
            self.fig,
            storage,
            plans,
            config.id(),
            layout,
            lambda: checkpoint_stamp(storage),
            self.notes,
            threads=spare_cores(len(ctx.node_peers)),
        )
        self.gate = gate.strategy(job, signed=self.signed)
        # replicas: who reads what from storage, before the hash plan
        link = replicas.link(self.gate, planner)
        prepared = self.gate.prepare()  # before any read: preconditions, who hashes what
        at = placement.placement(opts, ctx.world)  # every rank: the same anchor and options
        self.meeting.meet(self.fig, ctx, Terms.of(opts, layout, config, self.gate.anchor(), at))
        with prepared.alongside():  # whole-file hashing on its own thread, beside the copies
            self.fig.read_started(self.started, first=self.first)  # the loop reads first
            self.result = steps.run_rank(
                storage, plan, prepared, opts=opts, ctx=ctx, sink=self.sink, link=link
            )
        steps.measure_cache(self.fig, storage, ctx, opts, before=False)
        steps.count(self.fig, self.result, plan, ctx)
        self.gate.settle(self.result)  # this rank's own verdicts; raises every problem at once
        self.deferred = locate(
            storage, self.gate.locators(plan.deferred), self.gate.locators_vouched_by
        )


def load_in(
    opts: LoadOptions | None,
    ctx: DistContext,
    *,
    error: LoadError | None = None,
    progress_sink: ProgressSink | None = None,
) -> RankShards:
    """Load in an existing context (``ctx``: this rank's group, before a device is picked).
    ``error``: a problem found before the context existed, raised inside so it still reaches the
    exchange."""
    warm()  # the kernels load on a thread, beside the load's first steps
    seq = CALLS.next(group_id(ctx))
    job = _RankLoad(opts or LoadOptions(), ctx, RankFigures(rank=ctx.rank, seq=seq), progress_sink)
    t0 = time.perf_counter_ns()
    with MemoryPeaks() as mem:
        job.attempt(seq, error)  # never raises: whatever fails goes into this rank's row
    job.fig.ns = time.perf_counter_ns() - t0
    job.fig.rss_peak, job.fig.anon_peak = mem.rss_peak, mem.anon_peak
    job.meeting.raise_lost()  # the handshake lost the group: no exchange can follow
    table = exchange(job.fig.to_row(), job.ctx, seq=seq, timeout_s=job.opts.timeout_s)
    ranks = [RankFigures.from_row(table[r]) for r in range(job.ctx.world)]
    verdict = gate.judge(ranks, job.gate)
    if not verdict.passed:
        job.result = None  # nothing partly loaded survives a failed load
        give_back(job.ctx.device)
        raise verdict.error()
    return served(
        job.opts,
        job.ctx,
        job.plan,
        job.result,
        job.deferred,
        ranks,
        job.notes,
        verdict,
        job.planner,
        job.gate,
    )

"""The one door for callers: :func:`load` returns this rank's verified shards, or raises on
every rank.

    shards = tpload.load(DIR, config="deepseek-v4-mtp", kind="expanded")
    shards.state_dict()   # {official name: this rank's tensor on its device}
    shards.report         # figures of every rank (the same table on each)
    shards.release()      # frees every buffer the load made

One call is a fixed sequence: open, plan, pre-flight, ``gate.prepare``, handshake, run,
``gate.settle``, exchange, verdict. Whatever fails on this rank becomes its rows' status, so a call
meets the handshake (agreement.py: every rank loads the same thing the same way, or none copies)
and the exchange exactly once each and no peer waits; after it, the verdict is a function of the
exchanged table alone, the same on every rank (verification/gate.py owns it).
"""

from __future__ import annotations

import logging
import os
import time

import torch.distributed as dist

from . import preflight, replicas, steps
from .agreement import Handshake, Terms, outcome
from .codecs._lazy import warm
from .deferred import locate
from .distributed import DistContext, call_world, context, pick_device, with_device
from .errors import LoadError
from .exchange import CALLS, exchange, group_id, share_nodes
from .options import LoadOptions, with_option_signature
from .pick import planner_of
from .plan import Layout, RankPlan
from .report import RankFigures
from .report.figures import process_first_load
from .report.memory import MemoryPeaks, device_peaks, reset_device_peaks
from .report.progress import ProgressSink
from .result import LoadResult
from .shards import RankShards, served
from .storage import Storage, open_storage
from .teardown import give_back
from .verification import gate, signing, strategy
from .verification.gate import check_pin, spare_cores
from .verification.store import checkpoint_stamp


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
                self.opts.tp or max(1, self.ctx.world // self.opts.ep // replicas.count(self.opts)),
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
        planner = self.planner = replicas.positions(planner_of(storage.catalogue, config), opts)
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
        at = replicas.placement(opts, ctx.world)  # every rank: the same anchor and options
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


def load(
    checkpoint: str | os.PathLike | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    cpu_group: dist.ProcessGroup | None = None,
    progress_sink: ProgressSink | None = None,
    **options: object,
) -> RankShards:
    """Load this rank's verified shards of ``checkpoint``; the keywords are :class:`LoadOptions`'
    fields.

    Ranks are counted in ``group`` (default: the world); the exchange runs on ``cpu_group``
    (default: ``group`` if it has a CPU backend). Under torchrun without a world it makes the
    default group (``cpu:gloo,cuda:nccl``) for this call only and destroys it before returning.
    Raises :class:`LoadError` on every rank if any rank fails; ``progress_sink`` replaces rank 0's
    progress (one call per tensor)."""
    error: LoadError | None = None
    try:
        opts = LoadOptions.for_load(checkpoint, options)
    except LoadError as e:  # still reach the exchange with it, so no peer waits
        opts, error = None, e
    if group is not None or cpu_group is not None:
        return load_in(opts, context(group, cpu_group), error=error, progress_sink=progress_sink)
    with call_world(timeout_s=opts.timeout_s if opts else LoadOptions().timeout_s):
        return load_in(opts, context(), error=error, progress_sink=progress_sink)


with_option_signature(load, RankShards)
logging.getLogger("tpload").addHandler(logging.NullHandler())

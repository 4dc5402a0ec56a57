"""The one door for callers: :func:`load` returns this rank's verified shards, or raises on every rank.

    shards = tpload.load(DIR, config="deepseek-v4-mtp", kind="expanded")
    shards.state_dict()   # {official name: this rank's tensor on its device}
    shards.report         # figures of every rank (the same table on each)
    shards.release()      # frees every buffer the load made

One call is a fixed sequence: open, plan, pre-flight, ``gate.prepare``, run, ``gate.settle``,
exchange, verdict. Whatever fails on this rank before the exchange becomes its row's status, so a
call reaches the one exchange exactly once and no peer waits; after it, the verdict is a function
of the exchanged table alone, the same on every rank (verification/gate.py owns it).
"""

from __future__ import annotations

import logging
import os
import time

import torch.distributed as dist

from . import preflight, replicas
from .codecs._lazy import warm
from .config import with_rules
from .deferred import locate
from .distributed import DistContext, call_world, context, pick_device, with_device
from .errors import LoadError, OptionsError
from .exchange import CALLS, exchange, group_id, share_nodes
from .loop import LoadResult, run
from .options import LoadOptions, with_option_signature
from .pick import choose, planner_of
from .plan import Layout, Planner, RankPlan
from .report import RankFigures, rank_log
from .report.figures import process_first_load
from .report.memory import MemoryPeaks, device_peaks, reset_device_peaks
from .report.progress import Progress, ProgressSink, Silent
from .shards import RankShards, served
from .storage import Storage, open_storage
from .storage.pagecache import REPORT_SAMPLE, ShardRelease, checkpoint_resident
from .teardown import give_back
from .text import escape_name
from .transfer import for_device
from .verification import gate, signing
from .verification.gate import Verify, check_pin, spare_cores
from .verification.hashing import Hasher
from .verification.store import checkpoint_stamp

log = logging.getLogger("tpload")


class _RankLoad:
    """Everything one rank does before the exchange, for one call; raises LoadError on any problem."""

    def __init__(
        self, opts: LoadOptions, ctx: DistContext, fig: RankFigures, sink: ProgressSink | None
    ) -> None:
        self.opts, self.ctx, self.fig, self.sink = opts, ctx, fig, sink
        self.result: LoadResult | None = None
        self.plan: RankPlan | None = None
        self.gate: gate.Strategy | None = None
        self.deferred: tuple = ()
        self.notes: list[str] = []
        self.started, self.first = time.perf_counter_ns(), process_first_load()

    def attempt(self, seq: int, error: LoadError | None) -> None:
        """Everything before the exchange; every failure becomes this rank's status and message."""
        fig = self.fig
        try:
            self.ctx, note = share_nodes(
                self.ctx, seq, self.opts.timeout_s
            )  # first: peers wait for this node name
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
            signing.precheck(
                self.opts
            )  # a model.sig: its bundle and the JSON files it signs, before any is read
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
        except LoadError as e:
            fig.failed, fig.message = 1, f"rank {self.ctx.rank}: {e}"
        except KeyboardInterrupt:
            fig.failed, fig.message = 1, f"rank {self.ctx.rank}: interrupted (Ctrl-C)"
        except Exception as e:  # a bug or an OS error: still reach the exchange so no peer hangs
            log.debug("[rank %d] load failed", self.ctx.rank, exc_info=True)
            fig.failed, fig.message = (
                1,
                f"rank {self.ctx.rank}: unexpected {type(e).__name__}: {escape_name(e)}",
            )

    def _load(self, storage: Storage, layout: Layout) -> None:
        """Open, plan, pre-flight, prepare, run, settle: everything up to the exchange."""
        opts, ctx = self.opts, self.ctx
        storage.catalogue.refuse_headers_only("loading it")
        check_pin(storage, opts.manifest_sha256)
        self.notes += (
            storage.catalogue.check_plan_files()
        )  # the JSON files the manifest pins (storage/pins.py)
        self._measure_cache(storage, before=True)
        config, why = choose(opts.config, storage.root, pins=storage.catalogue.pins)
        if why:
            self.notes.append(why)
            if ctx.rank == 0:
                rank_log(0).info("%s", why)
        config = with_rules(
            config,
            skip=opts.skip,
            defer=opts.defer,
            skip_activation_scales=opts.skip_activation_scales,
        )
        planner = self.planner = replicas.positions(planner_of(storage.catalogue, config), opts)
        planner.check_layout(layout, ctx.world)
        plans, sharing = self._plans(planner, layout)
        plan = self.plan = plans[ctx.rank]
        preflight.check(
            planner, layout, plan, ctx.device, sharing, int(opts.reserve_gib * preflight.GIB)
        )
        job = gate.Job(
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
        self.gate = gate.strategy(job)
        link = replicas.link(
            self.gate, planner
        )  # replicas: who reads what from storage, before the hash plan
        prepared = self.gate.prepare()  # before any read: preconditions, who hashes what
        with prepared.alongside():  # whole-file hashing on its own thread, beside the copies
            self.result = self._run(storage, plan, prepared, link)
        self._measure_cache(storage, before=False)
        self._figures(self.result, plan)
        self.gate.settle(self.result)  # this rank's own verdicts; raises every problem at once
        self.deferred = locate(
            storage, self.gate.locators(plan.deferred), self.gate.locators_vouched_by
        )

    def _plans(
        self, planner: Planner, layout: Layout
    ) -> tuple[dict[int, RankPlan], list[RankPlan]]:
        """This rank's plan and its node peers' (node hashing splits the node's work; on the CPU or a shared
        GPU, the peers' arenas share this rank's memory), each made once; and the plans sharing its memory."""
        ctx = self.ctx
        shares_memory = ctx.device.type == "cpu" or ctx.shared_device
        peers = ctx.node_peers if shares_memory or self.opts.verify == Verify.NODE else [ctx.rank]
        plans = {p: planner.plan(layout, self.opts.kind, p) for p in peers}
        return plans, [plans[p] for p in (peers if shares_memory else [ctx.rank])]

    def _run(
        self, storage: Storage, plan: RankPlan, prepared: gate.Prepared, link: object
    ) -> LoadResult:
        opts, ctx = self.opts, self.ctx
        release = (
            ShardRelease.expecting(storage, plan, prepared.hashes.mine)
            if opts.evict_page_cache
            else None
        )
        spare = spare_cores(len(ctx.node_peers))
        threads = min(opts.hash_threads, spare) if ctx.device.type == "cpu" else opts.hash_threads
        hasher = Hasher(
            prepared.hashes,
            threads=max(0, threads),
            digests=prepared.digests,
            on_done=(lambda n: release.done(storage.stored(n).path)) if release else None,
        )
        sink = self.sink or (
            Progress(plan.read_bytes, plan.served) if opts.progress and ctx.rank == 0 else Silent()
        )
        self.fig.read_started(self.started, first=self.first)  # the loop reads first
        return run(
            storage,
            plan,
            transfer=for_device(ctx.device),
            hasher=hasher,
            samples=opts.samples,
            progress=sink,
            release=release,
            link=link,
        )

    def _figures(self, result: LoadResult, plan: RankPlan) -> None:
        """This rank's counts (the gate adds its evidence)."""
        fig = self.fig
        fig.tensors, fig.bytes_read, fig.bytes_device = (
            len(result.outputs),
            plan.read_bytes,
            plan.arena_bytes,
        )
        fig.hashed, fig.bytes_hashed = len(result.hashed), result.bytes_hashed
        fig.device_checked, fig.sampled = result.device_checked, result.sampled
        fig.skipped, fig.deferred, fig.device = (
            len(plan.skipped),
            len(plan.deferred),
            str(self.ctx.device),
        )

    def _measure_cache(self, storage: Storage, *, before: bool) -> None:
        """The page cache is the node's: its first rank measures it, before, and after when evicting."""
        if self.ctx.rank == self.ctx.node_peers[0] and (before or self.opts.evict_page_cache):
            setattr(
                self.fig,
                "page_cache_before" if before else "page_cache_after",
                checkpoint_resident(storage.paths(), sample=REPORT_SAMPLE),
            )


def load_in(
    opts: LoadOptions | None,
    ctx: DistContext,
    *,
    error: LoadError | None = None,
    progress_sink: ProgressSink | None = None,
) -> RankShards:
    """Load in an existing context (``ctx``: this rank's group, before a device is picked).
    ``error``: a problem found before the context existed, raised inside so it still reaches the exchange."""
    warm()  # the kernels load on a thread, beside the load's first steps
    seq = CALLS.next(group_id(ctx))
    job = _RankLoad(opts or LoadOptions(), ctx, RankFigures(rank=ctx.rank, seq=seq), progress_sink)
    t0 = time.perf_counter_ns()
    with MemoryPeaks() as mem:
        job.attempt(seq, error)  # never raises: whatever fails goes into this rank's row
    job.fig.ns = time.perf_counter_ns() - t0
    job.fig.rss_peak, job.fig.anon_peak = mem.rss_peak, mem.anon_peak
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
        if checkpoint is None:  # only the command line writes and loads the built-in checkpoint
            raise OptionsError(
                "checkpoint: load() needs a checkpoint folder (the built-in synthetic one is "
                "`python -m tpload`'s default, not the library's)"
            )
        opts = LoadOptions.from_values({**options, "checkpoint": checkpoint})
    except LoadError as e:  # still reach the exchange with it, so no peer waits
        opts, error = None, e
    if group is not None or cpu_group is not None:
        return load_in(opts, context(group, cpu_group), error=error, progress_sink=progress_sink)
    with call_world(timeout_s=opts.timeout_s if opts else LoadOptions().timeout_s):
        return load_in(opts, context(), error=error, progress_sink=progress_sink)


with_option_signature(load, RankShards)
logging.getLogger("tpload").addHandler(logging.NullHandler())

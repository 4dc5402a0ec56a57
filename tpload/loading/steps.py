"""The steps of one rank's load that are more than a call: sequence.py sequences them.

Each takes what it needs as arguments (options, the rank's context, the plan) and returns what the
next step uses, so sequence.py reads as the sequence alone: the config, the node's plans, the loop
with its hasher and progress, this rank's counts (the read source's and the gate's findings copied
into its row) and the node's page-cache figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..distributed.placement import Placement, position
from ..distributed.world import DistContext
from ..model.errors import LoadError
from ..model.figures import RankFigures
from ..model.modes import Verify
from ..model.progress import ProgressSink
from ..model.values import Layout
from ..options.load_options import LoadOptions
from ..planning.planner import Planner, RankPlan
from ..report.log import rank_log
from ..report.progress import Phases, Progress, Tally
from ..selection.config import Config, with_rules
from ..sources.base import ReadSource
from ..sources.hashing import Hasher, hash_threads
from ..storage.base import Storage
from ..storage.pagecache import REPORT_SAMPLE, ShardRelease, checkpoint_resident
from ..transfer.device import for_device
from ..verification.strategy import Findings, Prepared
from .loop import run
from .pick import choose, refuse_other_rules
from .result import LoadResult


def config_of(storage: Storage, opts: LoadOptions, ctx: DistContext, notes: list[str]) -> Config:
    """The config the load plans by (``--config``, or picked from config.json against the
    catalogue's pins) with the load's skip and defer rules; why it was picked goes into ``notes``
    (the report's, which the table prints: at DEBUG rank 0's log says it as it is picked too)."""
    cat = storage.catalogue
    config, why = choose(opts.config, storage.root, pins=cat.pins, header=cat.gguf, names=cat.names)
    if why:
        notes.append(why)
        if ctx.rank == 0:
            rank_log(0).debug("%s", why)
    config = with_rules(
        config,
        skip=opts.skip,
        defer=opts.defer,
        skip_activation_scales=opts.skip_activation_scales,
    )
    refuse_other_rules(storage.root, config)  # an export: the rules it was cut by, or none
    return config


def node_plans(
    planner: Planner, layout: Layout, opts: LoadOptions, ctx: DistContext, at: Placement | None
) -> tuple[dict[int, RankPlan], list[RankPlan]]:
    """This rank's plan and its node peers' (node hashing splits the node's work; on the CPU or a
    shared GPU the peers' arenas share this rank's memory), each made once, as the position each
    stands at (``at``: with replicas); and the plans that share this rank's memory (the pre-flight
    sums them)."""
    shares_memory = ctx.device.type == "cpu" or ctx.shared_device
    peers = ctx.node_peers if shares_memory or opts.verify == Verify.NODE else [ctx.rank]
    plans = {p: planner.plan(layout, opts.kind, position(at, p)) for p in peers}
    return plans, [plans[p] for p in (peers if shares_memory else [ctx.rank])]


def run_rank(
    storage: Storage,
    source: ReadSource,
    plan: RankPlan,
    prepared: Prepared,
    *,
    opts: LoadOptions,
    ctx: DistContext,
    sink: ProgressSink | None,
    phases: Phases,
    clause: Callable[[], str],
    turns: Mapping[str, int] | None = None,
) -> LoadResult:
    """The loop over ``plan``, reading from ``source``, with the hasher the gate prepared (on the
    CPU, on the node's spare cores only: the copies need the others), page-cache eviction when
    asked, and rank 0's progress unless the caller gave its own sink; ``turns``: the order it
    reads in (sources/order.py: what it leads first)."""
    release = (
        ShardRelease.expecting(storage, plan, prepared.hashes.mine)
        if opts.evict_page_cache
        else None
    )
    threads = hash_threads(opts.hash_threads, len(ctx.node_peers), ctx.device.type)
    hasher = Hasher(
        prepared.hashes,
        threads=max(0, threads),
        digests=prepared.digests,
        on_done=(lambda n: release.done(storage.stored(n).path)) if release else None,
    )
    if sink is None:  # rank 0's progress names a straggler (``clause``); every rank counts bytes
        sink = (
            Progress(plan.read_bytes, plan.served, clause=clause)
            if opts.progress and ctx.rank == 0
            else Tally()
        )
    phases.counter, phases.total = sink, plan.read_bytes
    return run(
        source,
        plan,
        transfer=for_device(ctx.device),
        hasher=hasher,
        samples=opts.samples,
        progress=sink,
        release=release,
        ranks=storage.catalogue.ranks(),
        turns=turns,
    )


WHOLE_MESSAGE_CHARS = 8 << 20
"""The most of a failed rank's message its peers read from the rendezvous store (a header with a
million bad entries words 100 MiB of problems; every rank reads every failed rank's)."""


def bounded(message: str) -> str:
    """``message``, or its first :data:`WHOLE_MESSAGE_CHARS` and how much was left out."""
    if len(message) <= WHOLE_MESSAGE_CHARS:
        return message
    left = len(message) - WHOLE_MESSAGE_CHARS
    return f"{message[:WHOLE_MESSAGE_CHARS]}\n  ... (the rest, {left:,} characters, left out)"


def whole_messages(error: LoadError, ranks: list[RankFigures], whole: dict[int, str]) -> LoadError:
    """The verdict's ``error`` with each failed rank's message as the rank wrote it (``whole``: by
    rank, from the rendezvous store), where the exchanged row cut it at 4 KiB: a rank with a
    thousand problems has them all listed, not the first 4 KiB of them."""
    text = str(error)
    for r, message in whole.items():
        cut = ranks[r].message if r < len(ranks) else ""
        if cut and message != cut and message.startswith(cut):
            text = text.replace(cut, message, 1)
    return LoadError(text, reporter=error.reporter)


def timed(fig: RankFigures, phases: Phases) -> None:
    """The time of each phase this rank went through, in its figures (the report's
    ``phase_seconds``)."""
    fig.open_ns, fig.plan_ns = phases.ns["open"], phases.ns["plan"]
    fig.handshake_ns, fig.read_ns = phases.ns["handshake"], phases.ns["read"]


def count(fig: RankFigures, result: LoadResult, plan: RankPlan, ctx: DistContext) -> None:
    """This rank's counts in its figures, the read source's among them (the gate's findings follow:
    :func:`settled`)."""
    fig.tensors, fig.bytes_read, fig.bytes_device = (
        len(result.outputs),
        plan.read_bytes,
        plan.arena_bytes,
    )
    fig.hashed, fig.bytes_hashed = len(result.hashed), result.bytes_hashed
    fig.device_checked, fig.sampled = result.device_checked, result.sampled
    fig.skipped, fig.deferred = len(plan.skipped), len(plan.deferred)
    fig.device = str(ctx.device)
    read = result.source
    fig.bytes_from_storage, fig.bytes_from_peers = read.from_storage, read.from_peers
    fig.replicas_sent, fig.replicas_seen = read.sent, read.seen


def settled(fig: RankFigures, found: Findings) -> None:
    """What the gate settled of this rank's evidence, into its row (the gate writes no row)."""
    fig.digest, fig.prediction = found.digest, found.prediction
    if found.claims is not None:
        fig.claims = found.claims
    if found.seen is not None:
        fig.seen = found.seen
    if found.hashed is not None:
        fig.hashed = found.hashed
    if found.bytes_hashed is not None:
        fig.bytes_hashed = found.bytes_hashed


def measure_cache(
    fig: RankFigures, storage: Storage, ctx: DistContext, opts: LoadOptions, *, before: bool
) -> None:
    """The page cache is the node's: its first rank measures it, before, and after when the load
    evicts."""
    if ctx.rank == ctx.node_peers[0] and (before or opts.evict_page_cache):
        resident = checkpoint_resident(storage.paths(), sample=REPORT_SAMPLE)
        setattr(fig, "page_cache_before" if before else "page_cache_after", resident)

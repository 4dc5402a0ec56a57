"""The one door for callers: :func:`load` returns this rank's verified shards.

    shards = tpload.load(DIR, config="deepseek-v4-mtp", kind="expanded")
    shards.state_dict()   # {official name: this rank's tensor on its device}
    shards.report         # figures of every rank (the same table on each)
    shards.release()      # frees every buffer the load made
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import preflight
from .config import DEFAULT_CONFIG, load_config, with_rules
from .deferred import DeferredTensor, locate
from .dist import DistContext, context, exchange, keep_world
from .errors import LoadError
from .export import PartitionedCheckpoint, open_checkpoint
from .load import LoadResult, run
from .offline import check_predictions, layout_key, verified_prediction
from .pagecache import checkpoint_resident
from .plan import KINDS, Layout, Planner, RankPlan
from .preflight import GIB
from .report import LoadReport, MemoryPeaks, Progress, ProgressSink, RankFigures, rank_log
from .synth import PRESETS, cached_checkpoint
from .teardown import give_back
from .verify import VERIFY_MODES, assign_hashing


CACHE_SAMPLE = 8  # the report's page-cache figures look at one page run in 8 (an estimate, 1/8 of the cost)


@dataclass(frozen=True)
class LoadOptions:
    """Everything a load is asked to do (the CLI's flags, ``load()``'s keywords)."""

    checkpoint: str | None = None
    """Checkpoint directory; None loads the built-in small synthetic checkpoint (made once, cached)."""
    config: str = DEFAULT_CONFIG
    """A shipped config name or a path to a TOML file."""
    kind: str = "packed"
    """``packed``: stored bytes (FP4/FP8 weights and their scales); ``expanded``: bf16 decodes."""
    tp: int | None = None
    """Tensor-parallel degree; None: the group size divided by ``ep``."""
    ep: int = 1
    """Expert-parallel degree (tp x ep must equal the group size)."""
    verify: str = "node"
    """``node``: each tensor hashed once per node; ``rank``: by every rank that reads it; ``digest``: no
    hashing, every served byte checked (by fingerprint) against digests ``tpload plan --write`` verified
    by sha256 and stored; ``off``: nothing checked."""
    device: str | None = None
    """Target device; None: cuda:LOCAL_RANK, or the CPU without CUDA."""
    hash_threads: int = 2
    """sha256 worker threads per rank."""
    samples: int = 4
    """Expanded kind: per role, how many decodes are checked exactly against a host decode."""
    progress: bool = True
    """Show rank-0 progress."""
    timeout_s: float = 600.0
    """Collective timeout when tpload creates the process group."""
    skip: tuple[str, ...] = ()
    """Globs of tensors never read nor hashed (tried before the config's rules), e.g. ``mtp.*``."""
    defer: tuple[str, ...] = ()
    """Globs of tensors not uploaded: :meth:`RankShards.deferred` locates them for the model."""
    evict_page_cache: bool = False
    """Drop each shard's map and page cache once this rank is done with it (unified-memory machines)."""
    reserve_gib: float = 0.0
    """Device memory (GiB) the pre-flight keeps free for what runs after the load (KV cache...)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LoadError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.verify not in VERIFY_MODES:
            raise LoadError(f"verify {self.verify!r} is not one of {', '.join(VERIFY_MODES)}")
        if self.tp is not None and self.tp < 1 or self.ep < 1:
            raise LoadError(f"tp and ep must be >= 1 (got tp {self.tp}, ep {self.ep})")
        if self.hash_threads < 1 or self.samples < 0 or self.timeout_s <= 0 or self.reserve_gib < 0:
            raise LoadError("hash_threads >= 1, samples >= 0, timeout_s > 0 and reserve_gib >= 0 are required")


class RankShards:
    """This rank's verified shards. ``state_dict()`` is a view of one preallocated arena."""

    def __init__(self, result: LoadResult, plan: RankPlan, report: LoadReport,
                 deferred: tuple[DeferredTensor, ...] = ()) -> None:
        self._result: LoadResult | None = result
        self.plan = plan
        self.report = report
        self._deferred = deferred

    def state_dict(self) -> dict[str, torch.Tensor]:
        """{official name: this rank's tensor on its device}; views, not copies."""
        if self._result is None:
            raise LoadError("these shards were released")
        return dict(self._result.tensors)

    @property
    def hashed(self) -> list[str]:
        """Official tensors this rank checked by sha256 (its share of the node's hashing)."""
        return list(self._result.hashed) if self._result is not None else []

    def deferred(self) -> list[DeferredTensor]:
        """A locator (file, offset, length, dtype, shape, manifest sha256) for each deferred
        tensor this rank holds, in natural name order; they are not in :meth:`state_dict`."""
        return list(self._deferred)

    def release(self) -> None:
        """Free every buffer the load made: the arena (each served and decoded tensor is a
        view of it; views the caller still holds keep it alive), the allocators' cached
        device blocks and pinned staging buffers, and freed host heap pages."""
        if self._result is not None:
            self._result.tensors.clear()
            self._result.fingerprints.clear()
            self._result = None
        give_back(torch.device(self.report.device))


def _hash_share(planner: Planner, layout: Layout, kind: str, ctx: DistContext, plan: RankPlan, mode: str) -> list[str]:
    """The official tensors this rank must sha256 (see verify.py for the modes)."""
    if mode in ("off", "digest"):
        return []
    if mode == "rank" or planner.ckpt.per_rank:  # per-rank files: nobody can hash for another
        return plan.used_tensors
    peers = ctx.node_peers
    users: dict[str, list[int]] = {}
    for p in peers:
        for n in (plan if p == ctx.rank else planner.plan(layout, kind, p)).used_tensors:
            users.setdefault(n, []).append(p)
    return assign_hashing({n: planner.ckpt.info(n).nbytes for n in users}, peers, users)[ctx.rank]


def _spare_cores(ctx: DistContext) -> int:
    """Cores this rank may use beyond its main thread: its share of the node's cores, less one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores // max(1, len(ctx.node_peers)) - 1


def _device_peaks(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return 0, 0
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


class _KillAfter:
    """Test hook (TPLOAD_TEST_KILL="RANK:ITEMS"): SIGKILL this rank after ITEMS tensors,
    to show that the other ranks then stop with a message instead of hanging."""

    def __init__(self, inner: Progress, items: int) -> None:
        self._inner, self._left = inner, items

    def update(self, nbytes: int) -> None:
        self._inner.update(nbytes)
        self._left -= 1
        if self._left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        self._inner.close()


def _progress(plan: RankPlan, ctx: DistContext, enabled: bool) -> ProgressSink:
    progress = Progress(plan.read_bytes, len(plan.items), enabled=enabled and ctx.rank == 0)
    kill = os.environ.get("TPLOAD_TEST_KILL", "")
    if kill and int(kill.split(":")[0]) == ctx.rank:
        return _KillAfter(progress, int(kill.split(":")[1]))
    return progress


def _load_rank(opts: LoadOptions, ctx: DistContext,
               fig: RankFigures) -> tuple[LoadResult, RankPlan, str, tuple[DeferredTensor, ...]]:
    """Everything one rank does before the exchange; raises on any problem.
    Returns the predictions key and the deferred tensors' locators too."""
    layout = Layout(opts.tp or max(1, ctx.world // opts.ep), opts.ep)
    ckpt = open_checkpoint(opts.checkpoint, layout, ctx.rank, ctx.world)
    measures_cache = ctx.rank == ctx.node_peers[0]  # the page cache is the node's: one rank per node looks
    if measures_cache:
        fig.page_cache_before = checkpoint_resident(ckpt.shard_paths(), sample=CACHE_SAMPLE)
    config = with_rules(load_config(opts.config), skip=opts.skip, defer=opts.defer)
    planner = Planner(ckpt, config)
    planner.check_layout(layout, ctx.world)
    plan = planner.plan(layout, opts.kind, ctx.rank)
    if isinstance(ckpt, PartitionedCheckpoint):
        ckpt.check_plan(plan)
    preflight.check(planner, layout, plan, ctx.device, ctx.node_peers, int(opts.reserve_gib * GIB))
    key = layout_key(config, layout, opts.kind)
    if opts.verify == "digest":  # before any byte is read: refuse stale or missing verified digests
        verified_prediction(ckpt, key, fix=f"run `python -m tpload plan {opts.checkpoint} --tp {layout.tp} --ep {layout.ep} "
                            f"--kind {opts.kind} --config {opts.config} --write`, or load with --verify node")
    to_hash = _hash_share(planner, layout, opts.kind, ctx, plan, opts.verify)
    if opts.verify != "off":  # deferred too: their locators carry the manifest's sha256
        ckpt.check_manifest(sorted(set(plan.used_tensors) | set(to_hash) | set(plan.deferred)))
    result = run(ckpt, plan, device=ctx.device, to_hash=to_hash, hash_threads=opts.hash_threads, spare_cores=_spare_cores(ctx),
                 samples_per_role=opts.samples, progress=_progress(plan, ctx, opts.progress),
                 evict=opts.evict_page_cache)
    if measures_cache and opts.evict_page_cache:
        fig.page_cache_after = checkpoint_resident(ckpt.shard_paths(), sample=CACHE_SAMPLE)
    fig.tensors, fig.bytes_read, fig.bytes_device = len(result.tensors), plan.read_bytes, plan.arena_bytes
    fig.hashed, fig.bytes_hashed = len(result.hashed), result.bytes_hashed
    fig.device_checked, fig.sampled = result.device_checked, result.sampled
    fig.skipped, fig.deferred = len(plan.skipped), len(plan.deferred)
    fig.digest = result.digest()
    return result, plan, key, locate(ckpt, plan.deferred)


def _failure(ranks: list[RankFigures]) -> str:
    """One message for every rank: failed ranks grouped by what they said."""
    bad = [r for r in ranks if r.failed]
    said: dict[str, list[int]] = {}
    for r in bad:
        said.setdefault(r.message.removeprefix(f"rank {r.rank}: "), []).append(r.rank)
    head = (f"load failed on rank {', '.join(str(r.rank) for r in bad)} ({len(bad)} of {len(ranks)} ranks); "
            "no rank returned weights")
    return head + "".join(f"\nrank {', '.join(map(str, who))}: {msg}" for msg, who in said.items())


def load_in(opts: LoadOptions, ctx: DistContext) -> RankShards:
    log = rank_log(ctx.rank)
    fig = RankFigures(rank=ctx.rank, node=ctx.nodes[ctx.rank])
    result = plan = key = None
    deferred: tuple[DeferredTensor, ...] = ()
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    t0 = time.perf_counter_ns()
    with MemoryPeaks() as mem:
        try:
            result, plan, key, deferred = _load_rank(opts, ctx, fig)
        except LoadError as e:
            fig.failed, fig.message = 1, f"rank {ctx.rank}: {e}"
        except Exception as e:  # a bug or an OS error: still reach the exchange so no peer hangs
            log.debug("load failed", exc_info=True)
            fig.failed, fig.message = 1, f"rank {ctx.rank}: unexpected {type(e).__name__}: {e}"
    fig.ns = time.perf_counter_ns() - t0
    fig.device_alloc_peak, fig.device_reserved_peak = _device_peaks(ctx.device)
    fig.rss_peak, fig.anon_peak = mem.rss_peak, mem.anon_peak
    table = exchange(fig.to_row(), ctx)
    ranks = [RankFigures.from_row(r, table[r]) for r in range(ctx.world)]
    if any(r.failed for r in ranks):
        del result  # nothing partly loaded survives a failed load
        raise LoadError(_failure(ranks))
    # Every rank holds every digest, so every rank reaches the same verdict with no second collective.
    predicted, problems = check_predictions(Path(opts.checkpoint), key, [r.digest for r in ranks])
    if opts.verify == "digest" and not predicted:
        problems = [f"--verify digest: the prediction for {key} vanished during the load"]
    if problems:
        del result
        raise LoadError("load failed: digests differ from the stored predictions; no rank returned weights\n"
                        + "\n".join(problems))
    report = LoadReport(str(Path(opts.checkpoint)), opts.kind, plan.layout.tp, plan.layout.ep, opts.verify,
                        str(ctx.device), ranks, ctx.rank, _predictions_word(predicted, opts.verify),
                        evict_page_cache=opts.evict_page_cache)
    if opts.verify == "off":
        log.warning("verification is OFF: %d tensors served without any check against the manifest", fig.tensors)
    return RankShards(result, plan, report, deferred)


def _predictions_word(predicted: bool, verify: str) -> str:
    if not predicted:
        return "none stored"
    return "matched (sha256-verified when written; trusted in place of hashing)" if verify == "digest" else "matched"


def resolve_checkpoint(checkpoint: str | os.PathLike | None) -> str:
    """The checkpoint to load: the given one, or the built-in small synthetic one."""
    return str(checkpoint) if checkpoint is not None else str(cached_checkpoint(PRESETS["small"]))


def load(checkpoint: str | os.PathLike | None = None, *, config: str = DEFAULT_CONFIG, kind: str = "packed",
         tp: int | None = None, ep: int = 1, group: dist.ProcessGroup | None = None,
         device: str | torch.device | None = None, verify: str = "node", hash_threads: int = 2, samples: int = 4,
         progress: bool = True, timeout_s: float = 600.0, skip: tuple[str, ...] = (),
         defer: tuple[str, ...] = (), evict_page_cache: bool = False, reserve_gib: float = 0.0) -> RankShards:
    """Load this rank's verified shards of ``checkpoint``; see :class:`LoadOptions` for each option.

    Inside an initialized world, ranks are counted in ``group`` (default: the
    world). Run by torchrun without a world, it makes the default group and
    leaves it up for later loads (destroyed at exit). Raises :class:`LoadError`
    on every rank if any rank fails.
    """
    opts = LoadOptions(resolve_checkpoint(checkpoint), str(config), kind, tp, ep, verify,
                       str(device) if device is not None else None, hash_threads, samples, progress, timeout_s,
                       skip=tuple(skip), defer=tuple(defer), evict_page_cache=evict_page_cache,
                       reserve_gib=reserve_gib)
    if group is None:
        keep_world(device=opts.device, timeout_s=timeout_s)
    return load_in(opts, context(group, opts.device))


logging.getLogger("tpload").addHandler(logging.NullHandler())

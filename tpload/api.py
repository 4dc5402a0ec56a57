"""The one door for callers: :func:`load` returns this rank's verified shards, or raises on every rank.

    shards = tpload.load(DIR, config="deepseek-v4-mtp", kind="expanded")
    shards.state_dict()   # {official name: this rank's tensor on its device}
    shards.report         # figures of every rank (the same table on each)
    shards.release()      # frees every buffer the load made

A call reaches the one exchange exactly once whatever fails on this rank
(an option, the checkpoint, a device), so no peer waits for it and no later
call meets this one's rows; after the exchange the verdict is a function of
the exchanged table alone, the same on every rank.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from . import preflight
from .config import with_rules
from .deferred import DeferredTensor, locate
from .distributed import DistContext, context, keep_world, pick_device, with_device
from .errors import LoadError
from .exchange import CALLS, exchange, group_id, share_nodes
from .loop import LoadResult, run
from .options import LoadOptions
from .pick import choose
from .plan import Layout, Planner, RankPlan, paused_gc
from .report import LoadReport, RankFigures, rank_log
from .report.memory import MemoryPeaks
from .report.progress import Progress, ProgressSink, Silent
from .storage import Storage, open_storage
from .storage.pagecache import ShardRelease, checkpoint_resident
from .teardown import give_back
from .text import escape_name
from .transfer import for_device
from .verification import crosscheck
from .verification.blake3sums import SHA256, Digests, content_hash, fix_command
from .verification.hashing import Hasher
from .verification.files import FileHashed, FileHasher, assign_files, file_problems, own_problems
from .verification.policy import HashPlan, hash_plan
from .verification.store import DigestStore, Prediction, stale

CACHE_SAMPLE = 8  # the report's page-cache figures look at one page run in 8 (an estimate, 1/8 of the cost)
log = logging.getLogger("tpload")


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
        return sorted(self._result.hashed) if self._result is not None else []

    def deferred(self) -> list[DeferredTensor]:
        """A locator (file, offset, length, dtype, shape, manifest sha256) for each deferred
        tensor this rank holds, in natural name order; they are not in :meth:`state_dict`."""
        return list(self._deferred)

    def release(self) -> None:
        """Free every buffer the load made: the arena (each served and decoded tensor is a
        view of it; views the caller still holds keep it alive), the allocators' cached
        device blocks and pinned staging buffers, and freed host heap pages."""
        self._result = None
        give_back(torch.device(self.report.device))


def layout_key(config_id: str, layout: Layout, kind: str) -> str:
    return f"tp{layout.tp}-ep{layout.ep}-{kind}-config-{config_id}"


def checkpoint_stamp(storage: Storage) -> dict:
    """What a verified prediction vouches for: the manifest's sha256 and each shard's size and mtime."""
    shards = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(storage.paths())}
    return {"manifest_sha256": storage.catalogue.manifest_sha256, "shards": shards}


def _spare_cores(ctx: DistContext) -> int:
    """Cores this rank may use beyond its main thread: its share of the node's cores, less one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores // max(1, len(ctx.node_peers)) - 1


class _RankLoad:
    """Everything one rank does before the exchange, for one call; raises LoadError on any problem."""

    def __init__(self, opts: LoadOptions, ctx: DistContext, fig: RankFigures, sink: ProgressSink | None) -> None:
        self.opts, self.ctx, self.fig, self.sink = opts, ctx, fig, sink
        self.result: LoadResult | None = None
        self.plan: RankPlan | None = None
        self.deferred: tuple[DeferredTensor, ...] = ()
        self.key = ""
        self.store_path = ""
        self.notes: list[str] = []
        self.file_split: dict[int, list[Path]] = {}

    def attempt(self, seq: int, error: LoadError | None) -> None:
        """Everything before the exchange; every failure becomes this rank's status and message."""
        fig = self.fig
        try:
            self.ctx, note = share_nodes(self.ctx, seq, self.opts.timeout_s)  # first: peers wait for this node name
            self.notes += [note] if note else []
            fig.node = self.ctx.nodes[self.ctx.rank]
            if error is not None:
                raise error
            device = pick_device(self.opts.device, self.ctx.local_rank, allow_shared=self.opts.allow_shared_device)
            self.ctx = with_device(self.ctx, device, shared=self.opts.allow_shared_device and device.type == "cuda")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            self.run()
            fig.device_alloc_peak, fig.device_reserved_peak = _device_peaks(device)
        except LoadError as e:
            fig.failed, fig.message = 1, f"rank {self.ctx.rank}: {e}"
        except KeyboardInterrupt:
            fig.failed, fig.message = 1, f"rank {self.ctx.rank}: interrupted (Ctrl-C)"
        except Exception as e:  # a bug or an OS error: still reach the exchange so no peer hangs
            log.debug("[rank %d] load failed", self.ctx.rank, exc_info=True)
            fig.failed, fig.message = 1, f"rank {self.ctx.rank}: unexpected {type(e).__name__}: {escape_name(e)}"

    def shards(self, ranks: list[RankFigures]) -> RankShards:
        """After a verdict that passed: the report, and this rank's shards."""
        opts, ctx = self.opts, self.ctx
        report = LoadReport(str(opts.checkpoint), opts.kind, self.plan.layout.tp, self.plan.layout.ep, opts.verify,
                            str(ctx.device), ranks, ctx.rank, trusted=opts.verify == "digest",
                            evict_page_cache=opts.evict_page_cache, notes=self.notes)
        if opts.verify == "off":
            rank_log(ctx.rank).warning("verification is OFF: %d tensors served without any check against the "
                                       "manifest", self.fig.tensors)
        if opts.report and ctx.rank == 0:
            try:
                report.write(opts.report)
            except OSError as e:
                rank_log(ctx.rank).warning("could not write the report %s: %s", escape_name(opts.report), e.strerror)
        return RankShards(self.result, self.plan, report, self.deferred)

    def run(self) -> None:
        opts, ctx = self.opts, self.ctx
        layout = Layout(opts.tp or max(1, ctx.world // opts.ep), opts.ep)
        # The collector paused for the whole job (plan.paused_gc): headers, plans, evidence and figures
        # are hundreds of thousands of small acyclic objects a big checkpoint makes, and its passes over
        # them cost more than making them.
        with paused_gc():
            storage = open_storage(opts.checkpoint, tp=layout.tp, ep=layout.ep, rank=ctx.rank, world=ctx.world)
            try:
                self._load(storage, layout)
            finally:
                storage.close()

    def _load(self, storage: Storage, layout: Layout) -> None:
        """Plan, check everything that can be checked before reading, read, and fill the figures."""
        storage.catalogue.refuse_headers_only("loading it")
        self._check_pin(storage)
        self._measure_cache(storage, before=True)
        config, why = choose(self.opts.config, storage.root)
        if why:
            self.notes.append(why)
            if self.ctx.rank == 0:
                rank_log(0).info("%s", why)
        config = with_rules(config, skip=self.opts.skip, defer=self.opts.defer)
        planner = Planner(storage.catalogue, config)
        planner.check_layout(layout, self.ctx.world)
        plans, sharing = self._plans(planner, layout)
        plan = self.plan = plans[self.ctx.rank]
        self._check_manifest(storage, plan)
        preflight.check(planner, layout, plan, self.ctx.device, sharing, int(self.opts.reserve_gib * preflight.GIB))
        stored = self._prediction(storage, config.id(), layout)
        reads = {p: q.reads for p, q in plans.items()}
        digests = SHA256
        if getattr(storage, "file_digests", None) is not None and self.opts.verify in ("node", "rank"):
            hashes, files = self._file_plan(storage, plans, reads)
        else:
            digests = self._content_hash(storage)
            tensors = storage.catalogue.tensors
            hashes = hash_plan(self.opts.verify, self.ctx.rank, reads,
                               {n: tensors[n].nbytes for q in plans.values() for n in q.used_tensors},
                               per_rank=storage.per_rank)
            files = None
        try:
            if files is not None:
                files.start()
            result = self.result = self._run(storage, plan, hashes, digests)
            hashed_files = files.finish() if files is not None else []
        finally:
            if files is not None:
                files.cancel()
        self._measure_cache(storage, before=False)
        self._figures(result, plan, stored, hashes)
        if files is not None:
            self._file_figures(storage, result, hashed_files, files, plans, hashes)
        self.deferred = locate(storage, plan.deferred)

    def _file_plan(self, storage: Storage, plans: dict[int, RankPlan],
                   reads: dict[int, dict]) -> tuple[HashPlan, FileHasher]:
        """A hub snapshot: whole files instead of tensors. This rank's files (node mode: its share of the
        files its node reads, each to one of its readers; rank mode: every file it reads), and who
        hashes the file of each tensor it reads."""
        me = self.ctx.rank
        if self.opts.verify == "rank":  # each rank hashes the files it reads, for its own windows only
            reads = {me: reads[me]}
        file_of = {n: storage.info(n).path for r in reads.values() for n in r}
        users: dict[Path, list[int]] = {}
        for p in sorted(reads):
            for n in reads[p]:
                if p not in users.setdefault(file_of[n], []):
                    users[file_of[n]].append(p)
        if self.opts.verify == "rank" or len(reads) == 1:
            split = {me: sorted({file_of[n] for n in reads[me]})}
        else:
            split = assign_files(users, {f: storage.files.get(f).opened.size for f in users}, sorted(reads))
        hasher_of = {f: r for r, fs in split.items() for f in fs}
        mine = set(split.get(me, []))
        peers = {n: {p: reads[p][n] for p in sorted(reads) if n in reads[p]} for n, f in file_of.items() if f in mine}
        owner = {n: hasher_of[file_of[n]] for n in reads[me] if hasher_of.get(file_of[n], me) != me}
        views = {c.name: c.view for q in plans.values() for item in q.items for c in item.cuts}
        self.file_split = split
        return HashPlan(self.opts.verify, me, frozenset(), owner, {}), FileHasher(storage, sorted(mine), peers, views)

    def _file_figures(self, storage: Storage, result: LoadResult, hashed: list[FileHashed], files: FileHasher,
                      plans: dict[int, RankPlan], hashes: HashPlan) -> None:
        """A hub snapshot's verdicts: each file's sha256 against its blob name, this rank's own windows
        against the bytes it hashed, the peers' through the exchange; and the node's amplification."""
        me, fig = self.ctx.rank, self.fig
        problems = file_problems(hashed, storage.file_digests) + own_problems(hashed, me, result.windows)
        if problems:
            raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
        fig.hashed = sum(len(h.peers) for h in hashed)
        fig.bytes_hashed = sum(h.nbytes for h in hashed)
        claims = {n: {p: b for p, b in by_peer.items() if p != me} for n, by_peer in files.peers.items()}
        fingerprints = {n: fp for h in hashed for n, fp in h.peers.items()}
        fig.claims = crosscheck.claims(claims, fingerprints, self.ctx.node_peers, me)
        fig.seen = crosscheck.seen(hashes.owner, result.windows, self.ctx.node_peers, me)
        node_files = {f for fs in self.file_split.values() for f in fs}
        hashed_bytes = sum(storage.files.get(f).opened.size for f in node_files)
        read_bytes = sum(q.read_bytes for q in plans.values()) if self.opts.verify == "node" else plans[me].read_bytes
        scope = "this node" if self.opts.verify == "node" else "this rank"
        note = (f"hub cache snapshot: {len(node_files)} file(s) checked whole against their blob sha256, "
                f"{hashed_bytes / 1e9:.3f} GB hashed for {read_bytes / 1e9:.3f} GB {scope} reads")
        if read_bytes and hashed_bytes > 1.2 * read_bytes:
            note += (f" ({hashed_bytes / read_bytes:.1f}x: whole files hold bytes no rank here serves; `python -m "
                     f"tpload manifest DIR` hashes per tensor, so each node hashes only what it serves)")
        self.notes.append(note)

    def _plans(self, planner: Planner, layout: Layout) -> tuple[dict[int, RankPlan], list[RankPlan]]:
        """This rank's plan and its node peers' (node hashing splits the node's work; on the CPU, or on
        a shared GPU, the peers' arenas share this rank's memory), each made once; and the plans that
        share this rank's memory."""
        ctx = self.ctx
        shares_memory = ctx.device.type == "cpu" or ctx.shared_device
        peers = ctx.node_peers if shares_memory or self.opts.verify == "node" else [ctx.rank]
        plans = {p: planner.plan(layout, self.opts.kind, p) for p in peers}
        return plans, [plans[p] for p in (peers if shares_memory else [ctx.rank])]

    def _check_manifest(self, storage: Storage, plan: RankPlan) -> None:
        """Every tensor the plan reads or defers is vouched for by the manifest (deferred ones too: their
        locators carry its sha256); a rank file of an export must hold exactly the plan's windows."""
        if self.opts.verify != "off" or storage.per_rank:
            problems = storage.manifest_problems(sorted(set(plan.used_tensors) | set(plan.deferred)))
            if problems:
                raise LoadError(f"{len(problems)} manifest problem(s):\n  - " + "\n  - ".join(problems))

    def _content_hash(self, storage: Storage) -> Digests:
        """blake3 against the operator's sidecar when one fits (blake3sums.content_hash: the same choice on
        every rank that sees the same store), sha256 against the manifest otherwise; a sidecar that
        exists but does not fit leaves a note saying why."""
        opts = self.opts
        if opts.verify not in ("node", "rank") or storage.per_rank:
            return SHA256
        digests, why = content_hash(DigestStore(opts.digest_store), storage.catalogue,
                                    lambda: checkpoint_stamp(storage), threads=max(1, _spare_cores(self.ctx)),
                                    fix=fix_command(opts.checkpoint, opts.digest_store))
        if why:
            self.notes.append(why)
            rank_log(self.ctx.rank).info("%s", why)
        self.fig.blake3 = int(digests.hash == "blake3")
        return digests

    def _measure_cache(self, storage: Storage, *, before: bool) -> None:
        """The page cache is the node's: its first rank measures it, before, and after when evicting."""
        if self.ctx.rank != self.ctx.node_peers[0]:
            return
        if before:
            self.fig.page_cache_before = checkpoint_resident(storage.paths(), sample=CACHE_SAMPLE)
        elif self.opts.evict_page_cache:
            self.fig.page_cache_after = checkpoint_resident(storage.paths(), sample=CACHE_SAMPLE)

    def _run(self, storage: Storage, plan: RankPlan, hashes: HashPlan, digests: Digests) -> LoadResult:
        opts, ctx = self.opts, self.ctx
        release = ShardRelease(storage.evict) if opts.evict_page_cache else None
        if release is not None:
            self._expect(storage, plan, hashes, release)
        threads = min(opts.hash_threads, _spare_cores(ctx)) if ctx.device.type == "cpu" else opts.hash_threads
        hasher = Hasher(hashes, threads=max(0, threads), digests=digests,
                        on_done=(lambda n: release.done(storage.stored(n).path)) if release else None)
        sink = self.sink or (Progress(plan.read_bytes, plan.served) if opts.progress and ctx.rank == 0 else Silent())
        return run(storage, plan, transfer=for_device(ctx.device), hasher=hasher, samples=opts.samples,
                   progress=sink, release=release)

    def _figures(self, result: LoadResult, plan: RankPlan, stored: Prediction | None, hashes: HashPlan) -> None:
        """This rank's row: its counts, digest, its own verdict on the stored prediction, and node
        mode's cross-check values."""
        fig, ctx = self.fig, self.ctx
        fig.tensors, fig.bytes_read, fig.bytes_device = len(result.outputs), plan.read_bytes, plan.arena_bytes
        fig.hashed, fig.bytes_hashed = len(result.hashed), result.bytes_hashed
        fig.device_checked, fig.sampled = result.device_checked, result.sampled
        fig.skipped, fig.deferred = len(plan.skipped), len(plan.deferred)
        fig.digest = result.digest()
        if stored is not None:
            fig.prediction = 1 if len(stored.digests) == ctx.world and stored.digests[ctx.rank] == fig.digest else 2
        if hashes.peers or hashes.owner:
            fingerprints = {n: h.peers for n, h in result.hashed.items()}
            fig.claims = crosscheck.claims(hashes.peers, fingerprints, ctx.node_peers, ctx.rank)
            fig.seen = crosscheck.seen(hashes.owner, result.windows, ctx.node_peers, ctx.rank)

    def _check_pin(self, storage: Storage) -> None:
        pin = self.opts.manifest_sha256
        if pin is None:
            return
        got = storage.catalogue.manifest_sha256
        if got is None or got != pin.lower():
            raise LoadError(f"{escape_name(storage.catalogue.manifest_path)}: sha256 {(got or 'none')[:16]}... is not "
                            f"the pinned {pin[:16]}... (--manifest-sha256): this is not the checkpoint you pinned")

    def _prediction(self, storage: Storage, config_id: str, layout: Layout) -> Prediction | None:
        """The stored digests for this layout (None if none), checked for ``--verify digest``
        before any byte is read: they must exist, be sha256-verified and fresh."""
        opts = self.opts
        self.key = layout_key(config_id, layout, opts.kind)
        store = DigestStore(opts.digest_store)
        manifest_sha = storage.catalogue.manifest_sha256
        self.store_path = str(store.path(manifest_sha)) if manifest_sha else str(store.root)
        stored = store.read(manifest_sha).get(self.key) if manifest_sha and not storage.per_rank else None
        if opts.verify != "digest":
            return stored
        fix = (f"run `python -m tpload plan {escape_name(opts.checkpoint)} --tp {layout.tp} --ep {layout.ep} "
               f"--kind {opts.kind} --config {escape_name(opts.config)} --write"
               + (f" --digest-store {escape_name(opts.digest_store)}" if opts.digest_store else "")
               + "`, or load with --verify node")
        if manifest_sha is None or storage.per_rank:
            raise LoadError(f"--verify digest needs a native checkpoint with a manifest; {escape_name(opts.checkpoint)} "
                            "has none" + ("" if storage.per_rank else "; write one with `python -m tpload manifest DIR`"))
        if stored is None:
            raise LoadError(f"--verify digest: the digest store {escape_name(self.store_path)} holds nothing for "
                            f"{self.key}; {fix}")
        changed = stale(stored.stamp, checkpoint_stamp(storage))
        if changed:
            raise LoadError(f"--verify digest: {', '.join(changed)} changed (size or mtime) since the digests in "
                            f"{escape_name(self.store_path)} were verified ({self.key}); {fix}")
        return stored

    @staticmethod
    def _expect(storage: Storage, plan: RankPlan, hashes: HashPlan, release: ShardRelease) -> None:
        for item in plan.items:
            for cut in item.cuts:
                s = storage.stored(cut.name)
                release.expect(s.path, s.offset, s.nbytes)
        for name in hashes.mine:
            s = storage.stored(name)
            release.expect(s.path, s.offset, s.nbytes)


def _verdict(ranks: list[RankFigures], ctx: DistContext, job: _RankLoad) -> str:
    """The load's outcome from the exchanged table alone: "" when every rank may return its weights."""
    seqs = {r.seq for r in ranks}
    if len(seqs) > 1:
        calls = ", ".join(f"rank {r.rank} in call {r.seq}" for r in ranks)
        return (f"load failed: the ranks are in different load() calls ({calls}); a caller that retries after a "
                "failure must retry on every rank; no rank returned weights")
    bad = [r for r in ranks if r.failed]
    if bad:
        said: dict[str, list[int]] = {}
        for r in bad:
            said.setdefault(r.message.removeprefix(f"rank {r.rank}: "), []).append(r.rank)
        head = (f"load failed on rank {', '.join(str(r.rank) for r in bad)} ({len(bad)} of {len(ranks)} ranks); "
                "no rank returned weights")
        return head + "".join(f"\nrank {', '.join(map(str, who))}: {msg}" for msg, who in said.items())
    problems = [f"rank {r.rank}: digest {r.digest[:16]}... differs from the prediction stored in "
                f"{escape_name(job.store_path)} ({job.key}): its memory does not hold what was verified"
                for r in ranks if r.prediction == 2]
    if ctx.group is not None:
        problems += crosscheck.verdict(ctx.node_lists, {r.rank: r.claims for r in ranks},
                                       {r.rank: r.seen for r in ranks})
    if problems:
        return "load failed: the ranks' evidence disagrees; no rank returned weights\n" + "\n".join(problems)
    return ""


def _device_peaks(device: torch.device) -> tuple[int | None, int | None]:
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def load_in(opts: LoadOptions | None, ctx: DistContext, *, error: LoadError | None = None,
            progress_sink: ProgressSink | None = None) -> RankShards:
    """Load in an existing context (``ctx``: this rank's group, before a device is picked).
    ``error``: a problem found before the context existed, raised inside so it still reaches the exchange."""
    seq = CALLS.next(group_id(ctx))
    job = _RankLoad(opts or LoadOptions(), ctx, RankFigures(rank=ctx.rank, seq=seq), progress_sink)
    t0 = time.perf_counter_ns()
    with MemoryPeaks() as mem:
        job.attempt(seq, error)  # never raises: whatever fails goes into this rank's row
    job.fig.ns = time.perf_counter_ns() - t0
    job.fig.rss_peak, job.fig.anon_peak = mem.rss_peak, mem.anon_peak
    table = exchange(job.fig.to_row(), job.ctx, seq=seq, timeout_s=job.opts.timeout_s)
    ranks = [RankFigures.from_row(table[r]) for r in range(job.ctx.world)]
    why = _verdict(ranks, job.ctx, job)
    if why:
        job.result = None  # nothing partly loaded survives a failed load
        give_back(job.ctx.device)
        raise LoadError(why, reporter=min((r.rank for r in ranks if r.failed), default=0))  # every rank holds `why`
    return job.shards(ranks)


def resolve_checkpoint(checkpoint: str | os.PathLike | None) -> str:
    """The checkpoint to load: the given one, or the built-in small synthetic one (written once)."""
    if checkpoint is not None:
        return os.fspath(checkpoint)
    from .synth import PRESETS, cached_checkpoint
    return str(cached_checkpoint(PRESETS["small"]))


def load(checkpoint: str | os.PathLike | None = None, *, group: dist.ProcessGroup | None = None,
         cpu_group: dist.ProcessGroup | None = None, progress_sink: ProgressSink | None = None,
         **options: object) -> RankShards:
    """Load this rank's verified shards of ``checkpoint``; the keywords are :class:`LoadOptions`' fields.

    Inside an initialized world, ranks are counted in ``group`` (default: the world) and the
    exchange runs on ``cpu_group`` (default: ``group`` when it has a CPU backend; pass one for an
    NCCL-only group). Run by torchrun without a world, it makes the default group
    (``cpu:gloo,cuda:nccl`` on a GPU, ``gloo`` on the CPU) and leaves it up for later loads. It
    never creates a group inside an existing world. Raises :class:`LoadError` on every rank if any
    rank fails; ``progress_sink`` replaces rank 0's progress (one call per tensor).
    """
    error: LoadError | None = None
    try:
        opts = LoadOptions.from_values({**options, "checkpoint": checkpoint})
        opts = replace(opts, checkpoint=resolve_checkpoint(opts.checkpoint))
    except LoadError as e:  # still reach the exchange with it, so no peer waits
        opts, error = None, e
    if group is None and cpu_group is None:
        keep_world(timeout_s=opts.timeout_s if opts else LoadOptions().timeout_s)
    return load_in(opts, context(group, cpu_group), error=error, progress_sink=progress_sink)


def _signature() -> None:
    """Give :func:`load` the keyword signature of :class:`LoadOptions` (help() and IDEs show every option)."""
    import inspect
    from dataclasses import fields
    params = [p for p in inspect.signature(load).parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
               for f in fields(LoadOptions) if f.name != "checkpoint"]
    load.__signature__ = inspect.Signature(params, return_annotation=RankShards)  # type: ignore[attr-defined]


_signature()
logging.getLogger("tpload").addHandler(logging.NullHandler())

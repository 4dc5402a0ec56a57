"""The gate: the one owner of what counts as verified, for every byte that leaves a load.

A load picks one :class:`Strategy` from the verify mode and what the checkpoint carries:

==================  =====================================================================
strategy            what vouches for a served byte
==================  =====================================================================
:class:`Unchecked`   nothing (``--verify off``, loudly marked)
:class:`Predicted`   the operator's stored prediction of each rank's digest (``digest``)
:class:`TensorDigests`  the manifest's per-tensor sha256 (or the blake3 sidecar), hashed once per
                     node (``node``) or by every reader (``rank``)
:class:`FileDigests`  a whole-file sha256 the folder carries (hub cache blob names, local-dir
                     download etags), each file hashed whole once per node by one of its readers
==================  =====================================================================

Each strategy has three steps, in the load's order: :meth:`Strategy.prepare` (its preconditions,
checked before any byte is read, and who hashes what), :meth:`Strategy.settle` (after the copies:
this rank's own problems raised at once, its figures written into its row) and
:meth:`Strategy.verdict` (after the exchange: problems only the whole table shows). The exit types
take the gate's output when they are made: :class:`Verdict` (only :func:`judge` makes a passing
one) for the served shards, a :class:`~tpload.deferred.DeferredTensor`'s digest from
:meth:`Strategy.locators`; neither can be made from bytes nothing vouched for.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .. import replicas
from ..errors import LoadError
from ..modes import PredictionState, Verify
from ..storage.hub import SNAPSHOT, FileSource
from ..text import escape_name
from . import crosscheck, hashing, signing
from .blake3sums import SHA256, Digests, content_hash, fix_command
from .files import FileHashed, FileHasher, assign_files, file_problems, own_problems
from .policy import HashPlan, hash_plan, readers
from .store import DigestStore, Prediction, stale
from .vouched import Vouched


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one load call, the same on every rank (from the exchanged table)."""

    problems: tuple[str, ...]
    vouched_by: str
    """What vouched for the served bytes, in words (the report's)."""
    reporter: int = 0
    """The rank that prints a failed verdict in full (the lowest failing one; the others point to
    it)."""

    @property
    def passed(self) -> bool:
        return not self.problems

    def require(self) -> None:
        """Raise unless every byte may leave: an exit type calls this when it is made."""
        if self.problems:
            raise self.error()

    def error(self) -> LoadError:
        """The failed verdict as the error every rank raises (the same text on each)."""
        return LoadError("\n".join(self.problems), reporter=self.reporter)


@dataclass
class Job:
    """What a strategy needs of the load in hand (filled by the load as it goes)."""

    opts: object
    """The load's LoadOptions."""
    ctx: object
    """The rank's DistContext (device picked)."""
    fig: object
    """This rank's RankFigures row."""
    storage: object
    """The opened checkpoint."""
    plans: Mapping[int, object]
    """This rank's RankPlan and its node peers' (for node hashing)."""
    config_id: str
    layout: object
    stamp: Callable[[], dict]
    """The checkpoint's stamp now (manifest sha256, each shard's size and mtime)."""
    notes: list[str] = field(default_factory=list)
    threads: int = 1
    """Spare cores of this rank, for hashing on the side."""
    reads: Mapping[int, Mapping[str, object]] | None = None
    """With replicas (replicas.py): each plan's windows its rank reads from storage itself (default:
    all)."""
    link: object = None
    """With replicas: this rank's replicas.Link (who read each window it received)."""

    @property
    def me(self) -> int:
        return self.ctx.rank

    @property
    def plan(self) -> object:
        return self.plans[self.ctx.rank]


@dataclass
class Prepared:
    """What a strategy hands the copy loop: who hashes what, by which hash, and a whole-file
    hasher."""

    hashes: HashPlan
    digests: Digests = SHA256
    files: FileHasher | None = None
    stored: Prediction | None = None
    """The stored prediction for this layout, when the store holds one."""

    @contextmanager
    def alongside(self) -> Iterator[None]:
        """Run the whole-file hasher (if any) on its own thread while the body copies; wait for it
        at the end (its error re-raised), and stop it if the body fails."""
        if self.files is None:
            yield
            return
        try:
            self.files.start()
            yield
            self.files.finish()
        finally:
            self.files.cancel()


def layout_key(config_id: str, layout: object, kind: str) -> str:
    return f"tp{layout.tp}-ep{layout.ep}-{kind}-config-{config_id}"


class Strategy(ABC):
    """One way of vouching for served bytes; see the module docstring."""

    vouched_by = ""
    locators_vouched_by = "the manifest's sha256 of the tensor"
    """What vouches for the digest a deferred tensor's locator checks (see :meth:`locators`)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.prepared: Prepared | None = None
        self.key = layout_key(job.config_id, job.layout, job.opts.kind)
        manifest_sha = job.storage.catalogue.manifest_sha256
        store = DigestStore(job.opts.digest_store)
        self.store_path = str(store.path(manifest_sha)) if manifest_sha else str(store.root)

    # -- before any read ------------------------------------------------------------------------
    def prepare(self) -> Prepared:
        """Check the preconditions (raise LoadError naming what is missing) and say who hashes
        what."""
        self._check_manifest()
        self.prepared = self._prepare()
        self.prepared.stored = self.prepared.stored or self._stored()
        return self.prepared

    @abstractmethod
    def _prepare(self) -> Prepared: ...

    def _check_manifest(self) -> None:
        """Every tensor the plan reads or defers has the digest this strategy needs."""
        job = self.job
        plan = job.plan
        problems = job.storage.manifest_problems(
            sorted(set(plan.used_tensors) | set(plan.deferred))
        )
        if problems:
            raise LoadError(f"{len(problems)} manifest problem(s):\n  - " + "\n  - ".join(problems))

    def _stored(self) -> Prediction | None:
        """The store's prediction for this layout, if any (any mode compares with one it finds)."""
        storage = self.job.storage
        sha = storage.catalogue.manifest_sha256
        if not sha or storage.per_rank:
            return None
        return DigestStore(self.job.opts.digest_store).read(sha).get(self.key)

    # -- after the copies ----------------------------------------------------------------------
    def settle(self, result: object) -> None:
        """This rank's own verdicts (raise every problem at once) and its row's evidence figures."""
        fig, ctx, stored = self.job.fig, self.job.ctx, self.prepared.stored
        fig.digest = result.digest()
        if stored is not None:
            at = replicas.placement(self.job.opts, ctx.world)  # replicas: one prediction a position
            me, world = (at.where(ctx.rank)[1], at.size) if at else (ctx.rank, ctx.world)
            match = len(stored.digests) == world and stored.digests[me] == fig.digest
            fig.prediction = PredictionState.MATCH if match else PredictionState.DIFFERS
            if not match and len(stored.digests) == world:
                self._name_differing(result, stored, me)
        hashes = self.prepared.hashes
        if hashes.peers or hashes.owner:
            fingerprints = hashing.column(result.hashed, "peers")
            fig.claims = crosscheck.claims(hashes.peers, fingerprints, ctx.node_peers, ctx.rank)
            fig.seen = crosscheck.seen(hashes.owner, result.windows, ctx.node_peers, ctx.rank)

    def _name_differing(self, result: object, stored: Prediction, me: int) -> None:
        """A digest that differs from its prediction: raise naming the served tensors that differ,
        from the per-tensor predictions stored with it (nothing to name without them)."""
        sha = self.job.storage.catalogue.manifest_sha256
        store = DigestStore(self.job.opts.digest_store)
        windows = store.read_windows(sha, self.key, stored.digests)
        if windows is None or len(windows) != len(stored.digests):
            return
        want, link = windows[me], self.job.link
        bad = [o.name for o in result.outputs if want.get(o.name) != result.fingerprints[o.name]]
        bad += sorted(set(want) - {o.name for o in result.outputs})
        said = [escape_name(n) + (link.source(n) if link else "") for n in bad[:8]]
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise LoadError(
            f"digest {self.job.fig.digest[:16]}... differs from the prediction stored in "
            f"{escape_name(self.store_path)} ({self.key}, position {me}): {len(bad)} served "
            f"tensor(s) differ: {', '.join(said)}{more}"
        )

    def locators(self, names: tuple[str, ...]) -> dict[str, str | None]:
        """The digest each deferred tensor's locator checks its streamed bytes against."""
        stored = self.job.storage.stored
        return {n: stored(n).sha256 for n in names}

    # -- after the exchange --------------------------------------------------------------------
    def verdict(self, ranks: list[object]) -> list[str]:
        """Problems only the exchanged table shows: a rank whose digest is not its prediction, a
        node peer that served other bytes than its hasher hashed."""
        problems = [
            f"rank {r.rank}: digest {r.digest[:16]}... differs from the prediction stored in "
            f"{escape_name(self.store_path)} ({self.key}): its memory does not hold what was "
            "verified"
            for r in ranks
            if r.prediction == PredictionState.DIFFERS
        ]
        ctx = self.job.ctx
        if ctx.group is not None:
            problems += crosscheck.verdict(
                ctx.node_lists, {r.rank: r.claims for r in ranks}, {r.rank: r.seen for r in ranks}
            )
            problems += replicas.verdict(ranks, replicas.placement(self.job.opts, len(ranks)))
        return problems


class Unchecked(Strategy):
    """``--verify off``: nothing is checked against the checkpoint; the report and a warning say
    so."""

    vouched_by = "nothing (--verify off)"
    locators_vouched_by = ""

    def _check_manifest(self) -> None:
        if (
            self.job.storage.per_rank
        ):  # an export's rank file must still hold exactly the plan's windows
            super()._check_manifest()

    def _prepare(self) -> Prepared:
        return Prepared(HashPlan(self.job.me))

    def locators(self, names: tuple[str, ...]) -> dict[str, str | None]:
        return dict.fromkeys(names)


class Predicted(Strategy):
    """``--verify digest``: the stored prediction must exist and be fresh before any byte is
    read."""

    vouched_by = "the stored prediction of every rank's digest (--verify digest)"

    def _prepare(self) -> Prepared:
        job, opts = self.job, self.job.opts
        layout = job.layout
        fix = (
            f"run `python -m tpload plan {escape_name(opts.checkpoint)} --tp {layout.tp} --ep "
            f"{layout.ep} --kind {opts.kind} --config {escape_name(opts.config)} --write"
            + (f" --digest-store {escape_name(opts.digest_store)}" if opts.digest_store else "")
            + "`, or load with --verify node"
        )
        storage = job.storage
        if storage.catalogue.manifest_sha256 is None or storage.per_rank:
            raise LoadError(
                "--verify digest needs a native checkpoint with a manifest; "
                f"{escape_name(opts.checkpoint)} has none"
                + ("" if storage.per_rank else "; write one with `python -m tpload manifest DIR`")
            )
        stored = self._stored()
        if stored is None:
            raise LoadError(
                f"--verify digest: the digest store {escape_name(self.store_path)} holds nothing "
                f"for {self.key}; {fix}"
            )
        changed = stale(stored.stamp, job.stamp())
        if changed:
            raise LoadError(
                f"--verify digest: {', '.join(changed)} changed (size or mtime) since the digests "
                f"in {escape_name(self.store_path)} were verified ({self.key}); {fix}"
            )
        return Prepared(HashPlan(job.me), stored=stored)


class TensorDigests(Strategy):
    """``node``/``rank`` on a checkpoint with a manifest: each tensor's sha256 (or the blake3
    sidecar)."""

    vouched_by = "the manifest's per-tensor digests"

    def _prepare(self) -> Prepared:
        job = self.job
        digests = self._content_hash()
        tensors = job.storage.catalogue.tensors
        reads = job.reads if job.reads is not None else {p: q.reads for p, q in job.plans.items()}
        sizes = {n: tensors[n].nbytes for q in job.plans.values() for n in q.used_tensors}
        hashes = hash_plan(job.opts.verify, job.me, reads, sizes, per_rank=job.storage.per_rank)
        return Prepared(hashes, digests)

    def _content_hash(self) -> Digests:
        """blake3 against the operator's sidecar when one fits (the same choice on every rank that
        sees the same store), sha256 otherwise; a sidecar that exists but does not fit leaves a
        note."""
        job, opts = self.job, self.job.opts
        if job.storage.per_rank:
            return SHA256
        digests, why = content_hash(
            DigestStore(opts.digest_store),
            job.storage.catalogue,
            job.stamp,
            threads=max(1, job.threads),
            fix=fix_command(opts.checkpoint, opts.digest_store),
        )
        if why:
            job.notes.append(why)
        job.fig.blake3 = int(digests.hash == "blake3")
        return digests


class FileDigests(Strategy):
    """A folder whose files are vouched for whole (hub cache blobs, local-dir etags: the storage's
    ``file_source`` words what it says about them): each file a rank's node reads
    from is hashed whole once per node by one of its readers, on a thread beside the copies, and
    every reader's windows are fingerprinted from the hashed bytes (checked in the exchange).

    Deferred tensors: the load does not read them, so nothing else would vouch for their bytes. A
    rank that defers a tensor hashes its file whole itself in this load, and derives the tensor's
    sha256 from the same pass; the locator then checks what the model streams against that digest
    (chosen over refusing the deferral: hub snapshots are the common case, and deferred tables are
    few; the cost, a file hashed by each rank that defers from it, is in the report's notes)."""

    def __init__(self, job: Job, source: FileSource | None = None) -> None:
        super().__init__(job)
        # the words of the digests' source (hub blob names, local-dir etags, a signature bundle)
        self.source = source or getattr(job.storage, "file_source", None) or SNAPSHOT
        self.vouched_by, self.locators_vouched_by = (
            self.source.vouched_by,
            self.source.locators_vouched_by,
        )

    def _check_manifest(self) -> None:
        return  # every file is vouched for whole (expected()), checked while loading

    def expected(self) -> Mapping[Path, str]:
        """Each file's expected sha256 (a source of whole-file digests overrides this)."""
        return self.job.storage.file_digests

    def _prepare(self) -> Prepared:
        job, me, storage = self.job, self.job.me, self.job.storage
        reads = job.reads if job.reads is not None else {p: q.reads for p, q in job.plans.items()}
        if (
            job.opts.verify == Verify.RANK
        ):  # each rank hashes the files it reads, for its own windows only
            reads = {me: reads[me]}
        file_of = {n: storage.info(n).path for r in reads.values() for n in r}
        users: dict[Path, list[int]] = {}  # each file: the ranks that read from it
        for n, ranks in readers(reads).items():
            users[file_of[n]] = sorted({*users.get(file_of[n], ()), *ranks})
        if job.opts.verify == Verify.RANK or len(reads) == 1:
            split = {me: sorted({file_of[n] for n in reads[me]})}
        else:
            split = assign_files(
                users, {f: storage.files.get(f).opened.size for f in users}, sorted(reads)
            )
        hasher_of = {f: r for r, fs in split.items() for f in fs}
        mine = set(split.get(me, []))
        peers = {
            n: {p: reads[p][n] for p in sorted(reads) if n in reads[p]}
            for n, f in file_of.items()
            if f in mine
        }
        owner = {n: hasher_of[file_of[n]] for n in reads[me] if hasher_of.get(file_of[n], me) != me}
        deferred = set(job.plan.deferred)
        extra = {
            storage.info(n).path for n in deferred
        } - mine  # files hashed only for this rank's deferrals
        views = {c.name: c.view for q in job.plans.values() for item in q.items for c in item.cuts}
        self.split, self.extra = split, extra
        files = FileHasher(storage, sorted(mine | extra), peers, views, deferred=deferred)
        return Prepared(HashPlan(me, frozenset(), owner, {}), files=files)

    def settle(self, result: object) -> None:
        job, me, fig = self.job, self.job.me, self.job.fig
        files = self.prepared.files
        hashed: list[FileHashed] = files.results
        problems = file_problems(
            hashed, self.expected(), named_by=self.source.named_by
        ) + own_problems(hashed, me, result.windows)
        if problems:
            raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
        self.derived = {n: d for h in hashed for n, d in h.deferred.items()}
        super().settle(result)
        fig.hashed = sum(len(h.peers) for h in hashed)
        fig.bytes_hashed = sum(h.nbytes for h in hashed)
        claims = {
            n: {p: b for p, b in by_peer.items() if p != me} for n, by_peer in files.peers.items()
        }
        fingerprints = {n: fp for h in hashed for n, fp in h.peers.items()}
        fig.claims = crosscheck.claims(claims, fingerprints, job.ctx.node_peers, me)
        fig.seen = crosscheck.seen(
            self.prepared.hashes.owner, result.windows, job.ctx.node_peers, me
        )
        job.notes.append(self._note())

    def _note(self) -> str:
        job, storage = self.job, self.job.storage
        node = job.opts.verify == Verify.NODE
        node_files = {f for fs in self.split.values() for f in fs}
        hashed_bytes = sum(storage.files.get(f).opened.size for f in node_files)
        read_bytes = sum(q.read_bytes for q in job.plans.values()) if node else job.plan.read_bytes
        scope = "this node" if node else "this rank"
        note = (
            f"{self.source.kind}: {len(node_files)} file(s) checked whole against "
            f"{self.source.against}, {hashed_bytes / 1e9:.3f} GB hashed for "
            f"{read_bytes / 1e9:.3f} GB {scope} reads"
        )
        if read_bytes and hashed_bytes > 1.2 * read_bytes:
            note += (
                f" ({hashed_bytes / read_bytes:.1f}x: whole files hold bytes no rank here serves; "
                "`python -m tpload manifest DIR` hashes per tensor, so each node hashes only "
                "what it serves)"
            )
        if self.extra:
            extra = sum(storage.files.get(f).opened.size for f in self.extra)
            note += (
                f"; {len(self.extra)} more file(s), {extra / 1e9:.3f} GB, hashed by this rank for "
                "the tensors it defers"
            )
        return note

    def locators(self, names: tuple[str, ...]) -> dict[str, str | None]:
        missing = [n for n in names if n not in self.derived]
        if missing:  # never a locator without a digest from this load
            raise LoadError(
                f"deferred tensor(s) {', '.join(map(escape_name, missing))}: their files were not "
                "hashed in this load"
            )
        return {n: self.derived[n] for n in names}


class SignedFiles(FileDigests):
    """A model.sig over the folder's files (verification/signing.py): each file a node reads is
    hashed whole once per node against the digest the bundle signs for it (or its signed pieces'),
    exactly like hub blobs; every file the load reads must be signed."""

    def __init__(self, job: Job, signed: object) -> None:
        what = f"the digests {signed.what} signs"
        super().__init__(
            job,
            FileSource(
                kind=signed.bundle.name,
                against="their signed digests",
                named_by=f"{what} for it",
                each=f"{what} for it",
                names=what,
                vouched_by=f"{what} for each file (files hashed whole)",
                locators_vouched_by="the sha256 taken of it while its file was hashed whole "
                "against its signed digest",
            ),
        )
        self.signed = signed

    def expected(self) -> Mapping[Path, object]:
        return self.signed.expected(self.job.storage.paths())

    def _prepare(self) -> Prepared:
        storage = self.job.storage
        self.signed.check_covered(storage.paths())
        if storage.catalogue.manifest is not None:
            self.job.notes.append(
                f"{escape_name(storage.catalogue.manifest_path)} is not signed: it is not an "
                f"anchor; {self.signed.bundle.name}'s file digests are"
            )
        prepared = super()._prepare()
        prepared.files.expect(self.expected())
        return prepared


class SignedManifest(TensorDigests):
    """A model.sig that signs NATIVE_MANIFEST.json: the manifest's per-tensor digests are the
    anchor, so each rank checks only its windows' tensors (no whole-file hashing)."""

    def __init__(self, job: Job, signed: object) -> None:
        super().__init__(job)
        self.signed = signed

    @property
    def vouched_by(self) -> str:
        return f"the manifest's per-tensor digests, the manifest signed by {self.signed.what}"

    def _prepare(self) -> Prepared:
        storage = self.job.storage
        self.signed.check_covered(storage.paths())
        self.signed.check_manifest(storage.catalogue.manifest_sha256)
        return super()._prepare()


def strategy(job: Job, *, signed: object = ...) -> Strategy:
    """The strategy for this load: from the verify mode and what vouches for the checkpoint's
    files. ``signed``: what ``signing.precheck`` found before the storage opened (a SignedModel or
    None), so the bundle is verified once a load; left out, it is checked here."""
    mode = Verify(job.opts.verify)
    if mode == Verify.OFF:
        return Unchecked(job)
    if mode == Verify.DIGEST:
        return Predicted(job)
    if signed is ...:
        signed = signing.precheck(job.opts)
    if signed is not None:
        return (SignedManifest if signed.manifest_sha256 else SignedFiles)(job, signed)
    if getattr(job.storage, "file_digests", None) is not None:
        return FileDigests(job)
    return TensorDigests(job)


def judge(ranks: list[object], chosen: Strategy | None) -> Verdict:
    """The load's verdict from the exchanged table alone, the same on every rank."""
    seqs = {r.seq for r in ranks}
    if len(seqs) > 1:
        calls = ", ".join(f"rank {r.rank} in call {r.seq}" for r in ranks)
        return Verdict(
            (
                f"load failed: the ranks are in different load() calls ({calls}); a caller that "
                "retries after a failure must retry on every rank; no rank returned weights",
            ),
            "",
        )
    bad = [r for r in ranks if r.failed]
    if bad:
        said: dict[str, list[int]] = {}
        for r in bad:
            said.setdefault(r.message.removeprefix(f"rank {r.rank}: "), []).append(r.rank)
        head = (
            f"load failed on rank {', '.join(str(r.rank) for r in bad)} ({len(bad)} of "
            f"{len(ranks)} ranks); no rank returned weights"
        )
        return Verdict(
            (
                head
                + "".join(f"\nrank {', '.join(map(str, who))}: {msg}" for msg, who in said.items()),
            ),
            "",
            reporter=bad[0].rank,
        )
    problems = chosen.verdict(ranks)
    if problems:
        return Verdict(
            (
                "load failed: the ranks' evidence disagrees; no rank returned weights\n"
                + "\n".join(problems),
            ),
            "",
        )
    return Verdict((), chosen.vouched_by)


def at_rest(
    storage: object,
    names: list[str],
    *,
    threads: int,
    digests: Digests = SHA256,
    what: str = "nothing written",
) -> Vouched:
    """The offline exit paths' gate (an export's sources, the blake3 sidecar): every named tensor
    read once and its sha256 checked against the manifest; raise CheckpointError listing every
    problem (manifest entries missing, mismatches, a file changed during the reads), else the
    digests as :class:`~tpload.verification.vouched.Vouched`, the only thing those writers take."""
    from ..errors import CheckpointError
    from .hashing import hash_whole, mismatches
    from .vouched import vouched

    problems = storage.manifest_problems(names)
    if not problems:
        hashed = hash_whole(storage, names, threads=threads, digests=digests)
        problems = mismatches(hashed) + storage.changed()
    if problems:
        raise CheckpointError(
            f"{what}: {len(problems)} problem(s) against the manifest:\n  - "
            + "\n  - ".join(problems)
        )
    return vouched(
        tuple(names),
        hashing.column(hashed, "sha256"),
        {a: hashing.column(hashed, a) for a in digests.also},
    )


def check_pin(storage: object, pin: str | None) -> None:
    """``--manifest-sha256``: the manifest must be the pinned one, before anything else is read."""
    got = storage.catalogue.manifest_sha256
    if pin is not None and (got is None or got != pin.lower()):
        raise LoadError(
            f"{escape_name(storage.catalogue.manifest_path)}: sha256 {(got or 'none')[:16]}... is "
            f"not the pinned {pin[:16]}... (--manifest-sha256): this is not the checkpoint you "
            "pinned"
        )


def spare_cores(node_ranks: int) -> int:
    """Cores a rank may use beyond its main thread: its share of the node's cores, less one."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return cores // max(1, node_ranks) - 1

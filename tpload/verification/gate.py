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
                     (whole_files.py, with :class:`SignedFiles`)
==================  =====================================================================

Each strategy has three steps, in the load's order: :meth:`Strategy.prepare` (its preconditions,
checked before any byte is read, and who hashes what), :meth:`Strategy.settle` (after the copies:
this rank's own problems raised at once, its figures written into its row) and
:meth:`Strategy.verdict` (after the exchange: problems only the whole table shows). The exit types
take the gate's output when they are made: :class:`Verdict` (only :func:`judge` makes a passing
one) for the served shards, a :class:`~tpload.loading.deferred.DeferredTensor`'s digest from
:meth:`Strategy.locators`; neither can be made from bytes nothing vouched for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..model.errors import CheckpointError, LoadError
from ..model.modes import RankStatus, Verify
from ..model.progress import Meter
from ..model.text import escape_name
from . import signing
from .blake3sums import SHA256, Digests, content_hash, fix_command
from .hashing import hash_whole, mismatches
from .policy import HashPlan, hash_plan
from .store import stale
from .strategy import Job, Prepared, Strategy
from .terms import disagreement
from .trust import UNCHECKED, TrustKind, TrustSource
from .vouched import Vouched, vouched
from .whole_files import FileDigests, SignedFiles, statement


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one load call, the same on every rank (from the exchanged table)."""

    problems: tuple[str, ...]
    vouched_by: str
    """What vouched for the served bytes, in words (the report's)."""
    trust: TrustSource | None = None
    """The same as a record: kind, file, sha256, signer (a passed verdict's; the report's)."""
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


class Unchecked(Strategy):
    """``--verify off``: nothing is checked against the checkpoint; the report and a warning say
    so."""

    vouched_by = "nothing (--verify off)"
    locators_vouched_by = ""

    def trust(self) -> TrustSource:
        return UNCHECKED

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

    def trust(self) -> TrustSource:
        cat = self.job.storage.catalogue
        return TrustSource(
            TrustKind.PREDICTION,
            self.store_path,
            manifest=str(cat.manifest_path),
            manifest_sha256=cat.manifest_sha256,
        )

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
            self.store,
            job.storage.catalogue,
            job.stamp,
            threads=max(1, job.threads),
            fix=fix_command(opts.checkpoint, opts.digest_store),
        )
        if why:
            job.notes.append(why)
        job.fig.blake3 = int(digests.hash == "blake3")
        return digests


class SignedManifest(TensorDigests):
    """A model.sig that signs NATIVE_MANIFEST.json: the manifest's per-tensor digests are the
    anchor, so each rank checks only its windows' tensors (no whole-file hashing)."""

    def __init__(self, job: Job, signed: object) -> None:
        super().__init__(job)
        self.signed = signed

    @property
    def vouched_by(self) -> str:
        return f"the manifest's per-tensor digests, the manifest signed by {self.signed.what}"

    def anchor(self) -> str:
        return f"{super().anchor()}, {self.signed.bundle.name} signs {statement(self.signed)}"

    def trust(self) -> TrustSource:
        signed, cat = self.signed, self.job.storage.catalogue
        return TrustSource(
            TrustKind.SIGNATURE,
            str(signed.bundle),
            signed.bundle_sha256,
            signed.signer_id,
            manifest=str(cat.manifest_path),
            manifest_sha256=signed.manifest_sha256,
        )

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
    # the ranks that failed; those that only stopped because one did follow them (all of them
    # when none says it failed: a row is never taken as a pass unless it says so)
    bad = [r for r in ranks if r.failed == RankStatus.FAILED] or [r for r in ranks if r.failed]
    if bad:
        said: dict[str, list[int]] = {}
        failed = {r.rank for r in bad}
        for r in bad + [r for r in ranks if r.failed and r.rank not in failed]:
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
    problems = disagreement(ranks) or chosen.verdict(ranks)
    if problems:
        return Verdict(
            (
                "load failed: the ranks' evidence disagrees; no rank returned weights\n"
                + "\n".join(problems),
            ),
            "",
        )
    return Verdict((), chosen.vouched_by, chosen.trust())


def at_rest(
    storage: object,
    names: list[str],
    *,
    threads: int,
    digests: Digests = SHA256,
    what: str = "nothing written",
    progress: Meter | None = None,
) -> Vouched:
    """The offline exit paths' gate (an export's sources, the blake3 sidecar): every named tensor
    read once and its sha256 checked against the manifest; raise CheckpointError listing every
    problem (manifest entries missing, mismatches, a file changed during the reads), else the
    digests as :class:`~tpload.verification.vouched.Vouched`, the only thing those writers take.
    ``progress``: the command's meter, for the reads."""
    cat = storage.catalogue
    if cat.manifest is None:  # whole-file digests (blob names, etags) vouch for no tensor alone
        raise CheckpointError(
            f"{what}: {escape_name(cat.root)} has no {escape_name(cat.manifest_path.name)}, and "
            "this checks each tensor against the manifest's sha256 (a hub snapshot's blob names "
            "or a local-dir download's etags vouch for whole files only); write one with "
            f"`python -m tpload manifest {escape_name(cat.root)}` (it checks each file against "
            "them first)"
        )
    problems = storage.manifest_problems(names)
    if not problems:
        hashed = hash_whole(
            storage, names, threads=threads, digests=digests, progress=progress, what="checking"
        )
        problems = mismatches(hashed) + storage.changed()
    if problems:
        raise CheckpointError(
            f"{what}: {len(problems)} problem(s) against the manifest:\n  - "
            + "\n  - ".join(problems)
        )
    return vouched(
        tuple(names),
        hashed.column("sha256"),
        {a: hashed.column(a) for a in digests.also},
    )


def check_pin(storage: object, pin: str | None) -> None:
    """``--manifest-sha256``: the manifest must be the pinned one, before anything else is read."""
    got = storage.catalogue.manifest_sha256
    if pin is not None and got is None:
        raise LoadError(
            f"{escape_name(storage.catalogue.manifest_path)}: no manifest, but --manifest-sha256 "
            f"pins {pin[:16]}...: this is not the checkpoint you pinned (whatever else vouches for "
            "this folder, the pin names a manifest)"
        )
    if pin is not None and got != pin.lower():
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

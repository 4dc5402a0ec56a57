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
this rank's own problems raised at once, what it settled returned as
:class:`~tpload.verification.strategy.Findings`, which the load copies into its row) and
:meth:`Strategy.verdict` (after the exchange: problems only the whole table shows; :func:`judge`
adds what only the read source can judge, handed in). The exit types take the gate's output when
they are made: :class:`Verdict` (only :func:`judge` makes a passing one) for the served shards, a
:class:`~tpload.loading.deferred.DeferredTensor`'s digest from :meth:`Strategy.locators`; neither
can be made from bytes nothing vouched for.

The gate reads no stored byte itself and imports nothing of the load: what it needs of the load is
typed by the Protocols of strategy.py, and the evidence it judges is produced by the read sources
(sources/: the hash taps, whole files hashed beside the copies, tensors read whole at rest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ..model.errors import CheckpointError, LoadError
from ..model.modes import RankStatus, Verify
from ..model.text import escape_name
from ..model.trust import UNCHECKED, TrustKind, TrustSource
from ..model.values import Box
from . import signing
from .hashes import SHA256, Digests, HashResults, mismatches
from .node import ByteSizes, HashPlan, hash_plan
from .signing import SignedModel
from .store import content_hash, fix_command, stale
from .strategy import Checkpoint, Job, Manifest, Prepared, RankRow, Strategy
from .terms import disagreement
from .vouched import Vouched, vouched
from .whole_files import FileDigests, SignedFiles


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
            self.job.checkpoint.per_rank
        ):  # an export's rank file must still hold exactly the plan's windows
            super()._check_manifest()

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        return Prepared(HashPlan(self.job.me))

    def locators(self, names: Sequence[str]) -> dict[str, str | None]:
        return dict.fromkeys(names)


class Predicted(Strategy):
    """``--verify digest``: the stored prediction must exist and be fresh before any byte is
    read."""

    vouched_by = "the stored prediction of every rank's digest (--verify digest)"

    def trust(self) -> TrustSource:
        cat = self.job.checkpoint.catalogue
        return TrustSource(
            TrustKind.PREDICTION,
            self.store_path,
            manifest=str(cat.manifest_path),
            manifest_sha256=cat.manifest_sha256,
        )

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        job, opts = self.job, self.job.opts
        layout = job.layout
        fix = (
            f"run `python -m tpload plan {escape_name(opts.checkpoint)} --tp {layout.tp} --ep "
            f"{layout.ep} --kind {opts.kind} --config {escape_name(opts.config)} --write"
            + (f" --digest-store {escape_name(opts.digest_store)}" if opts.digest_store else "")
            + "`, or load with --verify node"
        )
        checkpoint = job.checkpoint
        if checkpoint.catalogue.manifest_sha256 is None or checkpoint.per_rank:
            raise LoadError(
                "--verify digest needs a native checkpoint with a manifest; "
                f"{escape_name(opts.checkpoint)} has none"
                + (
                    ""
                    if checkpoint.per_rank
                    else "; write one with `python -m tpload manifest DIR`"
                )
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

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        job = self.job
        digests = self._content_hash()
        table = job.checkpoint.catalogue.table  # the split reads the sizes as one column
        sizes = ByteSizes(table.row, table.nbytes)
        mode = Verify(job.opts.verify)
        hashes = hash_plan(mode, job.me, reads, sizes, per_rank=job.checkpoint.per_rank)
        return Prepared(hashes, digests)

    def _content_hash(self) -> Digests:
        """blake3 against the operator's sidecar when one fits (the same choice on every rank that
        sees the same store), sha256 otherwise; a sidecar that exists but does not fit leaves a
        note."""
        job, opts = self.job, self.job.opts
        if job.checkpoint.per_rank:
            return SHA256
        digests, why = content_hash(
            self.store,
            job.checkpoint.catalogue,
            job.stamp,
            threads=max(1, job.threads),
            fix=fix_command(opts.checkpoint or "DIR", opts.digest_store),
        )
        if why:
            job.notes.append(why)
        return digests


class SignedManifest(TensorDigests):
    """A model.sig that signs NATIVE_MANIFEST.json: the manifest's per-tensor digests are the
    anchor, so each rank checks only its windows' tensors (no whole-file hashing)."""

    def __init__(self, job: Job, signed: SignedModel) -> None:
        super().__init__(job)
        self.signed: SignedModel = signed
        self.vouched_by = f"the manifest's per-tensor digests, the manifest signed by {signed.what}"

    def signature(self) -> str:
        return f"bundle sha256 {self.signed.bundle_sha256}, signer {self.signed.signer_id}"

    def trust(self) -> TrustSource:
        signed, cat = self.signed, self.job.checkpoint.catalogue
        return TrustSource(
            TrustKind.SIGNATURE,
            str(signed.bundle),
            signed.bundle_sha256,
            signed.signer_id,
            manifest=str(cat.manifest_path),
            manifest_sha256=signed.manifest_sha256,
        )

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        checkpoint = self.job.checkpoint
        self.signed.check_covered(checkpoint.paths())
        self.signed.check_manifest(checkpoint.catalogue.manifest_sha256)
        return super()._prepare(reads)


class NotChecked(Enum):
    """:func:`strategy`'s ``signed`` left out: the bundle is checked there."""

    NOT_CHECKED = "not checked"


NOT_CHECKED = NotChecked.NOT_CHECKED


def strategy(job: Job, *, signed: SignedModel | None | NotChecked = NOT_CHECKED) -> Strategy:
    """The strategy for this load: from the verify mode and what vouches for the checkpoint's
    files. ``signed``: what ``signing.precheck`` found before the storage opened (a SignedModel or
    None), so the bundle is verified once a load; left out, it is checked here."""
    mode = Verify(job.opts.verify)
    if mode == Verify.OFF:
        return Unchecked(job)
    if mode == Verify.DIGEST:
        return Predicted(job)
    if isinstance(signed, NotChecked):
        signed = signing.precheck(job.opts)
    if signed is not None:
        if signed.manifest_sha256:
            return SignedManifest(job, signed)
        return SignedFiles(job, signed)
    if job.checkpoint.file_digests is not None:
        return FileDigests(job)
    return TensorDigests(job)


def judge(ranks: Sequence[RankRow], chosen: Strategy | None, also: Sequence[str] = ()) -> Verdict:
    """The load's verdict from the exchanged table alone, the same on every rank. ``also``: the
    problems only the read source can find in the table (replicas: what each receiver holds
    against what its senders read; sources/), already worded."""
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
    if chosen is None:  # no failed row, yet no strategy: this rank never reached the gate
        return Verdict(("load failed: this rank reached the verdict without a gate",), "")
    problems = disagreement(ranks) or [*chosen.verdict(ranks), *also]
    if problems:
        return Verdict(
            (
                "load failed: the ranks' evidence disagrees; no rank returned weights\n"
                + "\n".join(problems),
            ),
            "",
        )
    return Verdict((), chosen.vouched_by, chosen.trust())


class HashAtRest(Protocol):
    """A producer of hashes at rest (sources/hashing.py's ``hash_whole``, bound to its storage):
    every named tensor read whole once, by ``digests``' hashes."""

    def __call__(self, names: Sequence[str], digests: Digests) -> HashResults: ...


def at_rest(
    checkpoint: Checkpoint,
    names: list[str],
    *,
    hash_whole: HashAtRest,
    digests: Digests = SHA256,
    what: str = "nothing written",
) -> Vouched:
    """The offline exit paths' gate (an export's sources, the blake3 sidecar): every named tensor
    read once (by ``hash_whole``) and its sha256 checked against the manifest; raise
    CheckpointError listing every problem (manifest entries missing, mismatches, a tensor not
    hashed, a file changed during the reads), else the digests as
    :class:`~tpload.verification.vouched.Vouched`, the only thing those writers take."""
    cat = checkpoint.catalogue
    if cat.manifest is None:  # whole-file digests (blob names, etags) vouch for no tensor alone
        raise CheckpointError(
            f"{what}: {escape_name(cat.root)} has no {escape_name(cat.manifest_path.name)}, and "
            "this checks each tensor against the manifest's sha256 (a hub snapshot's blob names "
            "or a local-dir download's etags vouch for whole files only); write one with "
            f"`python -m tpload manifest {escape_name(cat.root)}` (it checks each file against "
            "them first)"
        )
    problems = checkpoint.manifest_problems(names)
    hashed = HashResults()
    if not problems:
        hashed = hash_whole(names, digests)
        problems = mismatches(hashed) + [
            f"tensor {escape_name(n)}: not hashed (nothing vouches for it)"
            for n in names
            if n not in hashed
        ]
        problems += checkpoint.changed()
    if problems:
        raise CheckpointError(
            f"{what}: {len(problems)} problem(s) against the manifest:\n  - "
            + "\n  - ".join(problems)
        )
    return vouched(
        tuple(names),
        hashed.hexes("sha256"),
        {a: hashed.hexes(a) for a in digests.also},
    )


class Pinned(Protocol):
    @property
    def catalogue(self) -> Manifest: ...


def check_pin(checkpoint: Pinned, pin: str | None) -> None:
    """``--manifest-sha256``: the manifest must be the pinned one, before anything else is read."""
    got = checkpoint.catalogue.manifest_sha256
    path = checkpoint.catalogue.manifest_path
    if pin is not None and got is None:
        raise LoadError(
            f"{escape_name(path)}: no manifest, but --manifest-sha256 "
            f"pins {pin[:16]}...: this is not the checkpoint you pinned (whatever else vouches for "
            "this folder, the pin names a manifest)"
        )
    if pin is not None and got != pin.lower():
        raise LoadError(
            f"{escape_name(path)}: sha256 {(got or 'none')[:16]}... is "
            f"not the pinned {pin[:16]}... (--manifest-sha256): this is not the checkpoint you "
            "pinned"
        )

"""Strategies for folders whose files are vouched for whole: a hub snapshot's blob names, a
local-dir download's etags (:class:`FileDigests`), or a signature over the files
(:class:`SignedFiles`). Each file is hashed whole once per node by one of its readers, beside the
copies.

A node's ranks split the files (whole, balanced by bytes, each to a rank that reads from it:
node.assign_files). A rank hashes its share start to end on a thread of its own while its loop
copies windows (the read sources do: sources/whole_files.py), and from the very bytes it hashes
fingerprints every node peer's window of every tensor in the file, its own included. The exchange
then compares those with what each peer served (node.py); the rank compares its own windows itself.
A file whose bytes do not match its blob name fails the load on every rank, naming the file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..model.errors import LoadError
from ..model.modes import Verify
from ..model.text import escape_name
from ..model.trust import TrustKind, TrustSource
from ..model.values import SNAPSHOT, Box, FileSource
from . import node
from .hashes import Expected, FileHashed, file_problems, own_problems
from .node import HashPlan, WholeFiles, assign_files, readers
from .signing import SignedModel
from .strategy import Findings, Job, Outcome, Prepared, Strategy, digest_map


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

    whole_files = True

    def __init__(self, job: Job, source: FileSource | None = None) -> None:
        super().__init__(job)
        # the words of the digests' source (hub blob names, local-dir etags, a signature bundle)
        self.source = source or job.checkpoint.file_source or SNAPSHOT
        self.vouched_by, self.locators_vouched_by = (
            self.source.vouched_by,
            self.source.locators_vouched_by,
        )
        self.split: dict[int, list[Path]] = {}
        self.extra: set[Path] = set()
        self.derived: dict[str, str] = {}

    def _check_manifest(self) -> None:
        return  # every file is vouched for whole (expected()), checked while loading

    def trust(self) -> TrustSource:
        metadata = self.source.metadata
        if metadata is not None:  # the etags in the download's metadata folder
            return TrustSource(TrustKind.LOCAL_DIR, str(metadata))
        return TrustSource(TrustKind.HUB_SNAPSHOT, str(self.job.checkpoint.root))

    def expected(self) -> Mapping[Path, str | Expected]:
        """Each file's expected sha256 (a source of whole-file digests overrides this)."""
        return self.job.checkpoint.file_digests or {}

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        job, me, checkpoint = self.job, self.job.me, self.job.checkpoint
        if (
            job.opts.verify == Verify.RANK
        ):  # each rank hashes the files it reads, for its own windows only
            reads = {me: reads[me]}
        file_of = {n: checkpoint.stored(n).path for r in reads.values() for n in r}
        users: dict[Path, list[int]] = {}  # each file: the ranks that read from it
        for n, ranks in readers(reads).items():
            users[file_of[n]] = sorted({*users.get(file_of[n], ()), *ranks})
        if job.opts.verify == Verify.RANK or len(reads) == 1:
            split = {me: sorted({file_of[n] for n in reads[me]})}
        else:
            split = assign_files(users, {f: checkpoint.file_size(f) for f in users}, sorted(reads))
        hasher_of = {f: r for r, fs in split.items() for f in fs}
        mine = set(split.get(me, []))
        peers = {
            n: {p: reads[p][n] for p in sorted(reads) if n in reads[p]}
            for n, f in file_of.items()
            if f in mine
        }
        owner = {n: hasher_of[file_of[n]] for n in reads[me] if hasher_of.get(file_of[n], me) != me}
        deferred = frozenset(job.plan.deferred)
        extra = {
            checkpoint.stored(n).path for n in deferred
        } - mine  # files hashed only for this rank's deferrals
        views = {n: v for q in job.plans.values() for n, v in q.views().items()}
        self.split, self.extra = split, extra
        files = WholeFiles(sorted(mine | extra), peers, views, deferred, self._want())
        return Prepared(HashPlan(me, frozenset(), owner, {}), files=files)

    def _want(self) -> Mapping[Path, str | Expected]:
        """What each file must hash to, when not its whole sha256 (none here: a signature's)."""
        return {}

    def settle(self, outcome: Outcome, files: Sequence[FileHashed] = ()) -> Findings:
        job, me, prepared = self.job, self.job.me, self._ready()
        plan = prepared.files
        problems = file_problems(
            files, self.expected(), named_by=self.source.named_by
        ) + own_problems(files, me, outcome.windows)
        if problems:
            raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
        self.derived = {n: d for h in files for n, d in h.deferred.items()}
        found = super().settle(outcome, files)
        found.hashed = sum(len(h.peers) for h in files)
        found.bytes_hashed = sum(h.nbytes for h in files)
        claims = {
            n: {p: b for p, b in by_peer.items() if p != me}
            for n, by_peer in (plan.peers if plan is not None else {}).items()
        }
        fingerprints = {n: fp for h in files for n, fp in h.peers.items()}
        found.claims = node.claims(claims, fingerprints, job.where.node_peers, me)
        found.seen = node.seen(prepared.hashes.owner, outcome.windows, job.where.node_peers, me)
        job.notes.append(self._note())
        return found

    def _note(self) -> str:
        job, checkpoint = self.job, self.job.checkpoint
        whole_node = job.opts.verify == Verify.NODE
        node_files = {f for fs in self.split.values() for f in fs}
        hashed_bytes = sum(checkpoint.file_size(f) for f in node_files)
        read_bytes = (
            sum(q.read_bytes for q in job.plans.values()) if whole_node else job.plan.read_bytes
        )
        scope = "this node" if whole_node else "this rank"
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
            extra = sum(checkpoint.file_size(f) for f in self.extra)
            note += (
                f"; {len(self.extra)} more file(s), {extra / 1e9:.3f} GB, hashed by this rank for "
                "the tensors it defers"
            )
        return note

    def locators(self, names: Sequence[str]) -> dict[str, str | None]:
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

    def __init__(self, job: Job, signed: SignedModel) -> None:
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
        self.signed: SignedModel = signed

    def expected(self) -> Mapping[Path, str | Expected]:
        return self.signed.expected(self.job.checkpoint.paths())

    def _want(self) -> Mapping[Path, str | Expected]:
        return self.expected()

    def anchor(self) -> str:
        return f"signed digests {statement(self.signed)}"

    def signature(self) -> str:
        return f"bundle sha256 {self.signed.bundle_sha256}, signer {self.signed.signer_id}"

    def trust(self) -> TrustSource:
        signed = self.signed
        return TrustSource(
            TrustKind.SIGNATURE, str(signed.bundle), signed.bundle_sha256, signed.signer_id
        )

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        checkpoint = self.job.checkpoint
        self.signed.check_covered(checkpoint.paths())
        if checkpoint.catalogue.manifest is not None:
            self.job.notes.append(
                f"{escape_name(checkpoint.catalogue.manifest_path)} is not signed: it is not an "
                f"anchor; {self.signed.bundle.name}'s file digests are"
            )
        return super()._prepare(reads)


def statement(signed: SignedModel) -> str:
    """One sha256 over what a verified model.sig signs (each file's digest, or its pieces'): the
    same on every node holding the same signed statement, wherever its folder sits."""
    lines = {name: f"{h}:{d}" for name, (h, d) in signed.whole.items()}
    for name, cuts in signed.pieces.items():
        lines[name] = ",".join(f"{a}-{b}:{d}" for (a, b), d in sorted(cuts.items()))
    return digest_map(lines)

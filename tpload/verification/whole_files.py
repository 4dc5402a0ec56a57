"""Strategies for folders whose files are vouched for whole: a hub snapshot's blob names, a
local-dir download's etags (:class:`FileDigests`), or a signature over the files
(:class:`SignedFiles`). Each file is hashed whole once per node by one of its readers, beside the
copies."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..model.errors import LoadError
from ..model.modes import Verify
from ..model.text import escape_name
from ..model.windows import readers
from ..storage.hub import SNAPSHOT, FileSource
from ..storage.localdir import DOWNLOAD_DIR
from . import crosscheck
from .files import FileHashed, FileHasher, assign_files, file_problems, own_problems
from .policy import HashPlan
from .strategy import Job, Prepared, Strategy, digest_map
from .trust import TrustKind, TrustSource


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
        self.source = source or getattr(job.storage, "file_source", None) or SNAPSHOT
        self.vouched_by, self.locators_vouched_by = (
            self.source.vouched_by,
            self.source.locators_vouched_by,
        )

    def _check_manifest(self) -> None:
        return  # every file is vouched for whole (expected()), checked while loading

    def trust(self) -> TrustSource:
        storage = self.job.storage
        local = getattr(storage, "local", None)
        if local is not None:  # the etags in the download's metadata folder
            return TrustSource(TrustKind.LOCAL_DIR, str(local.root / DOWNLOAD_DIR))
        return TrustSource(TrustKind.HUB_SNAPSHOT, str(storage.root))

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

    def anchor(self) -> str:
        return f"{self.signed.bundle.name} signs digests {statement(self.signed)}"

    def trust(self) -> TrustSource:
        signed = self.signed
        return TrustSource(
            TrustKind.SIGNATURE, str(signed.bundle), signed.bundle_sha256, signed.signer_id
        )

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


def statement(signed: object) -> str:
    """One sha256 over what a verified model.sig signs (each file's digest, or its pieces'): the
    same on every node holding the same signed statement, wherever its folder sits."""
    lines = {name: f"{h}:{d}" for name, (h, d) in signed.whole.items()}
    for name, cuts in signed.pieces.items():
        lines[name] = ",".join(f"{a}-{b}:{d}" for (a, b), d in sorted(cuts.items()))
    return digest_map(lines)

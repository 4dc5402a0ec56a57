"""What every way of vouching for served bytes shares: the load in hand as the gate sees it
(:class:`Job`, typed by the Protocols below: the gate imports nothing of the load), what a strategy
hands the copy loop (:class:`Prepared`), what it settles (:class:`Findings`), and the
:class:`Strategy` base with its three steps (prepare, settle, verdict). The strategies themselves:
gate.py (tensor digests, predictions, none) and whole_files.py (files vouched for whole).

The Protocols say what the gate reads of the load, and nothing more: the options it reads
(:class:`VerifyOptions`), where this rank stands (:class:`Where`), the checkpoint as opened
(:class:`Checkpoint`), who reads what (:class:`RankReads`, one per rank of the node: the
placement), what a rank's loop left (:class:`Outcome`), where a received window came from
(:class:`Provenance`) and the exchanged rows (:class:`RankRow`). The load's own types satisfy them
as they are (LoadOptions, DistContext, a Storage, RankPlan, LoadResult, RankFigures)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..model.errors import LoadError
from ..model.modes import PredictionState
from ..model.text import escape_name
from ..model.trust import TrustKind, TrustSource
from ..model.values import Box, FileSource, Layout, Stored, Triple
from . import node
from .hashes import SHA256, Digests, FileHashed, HashResults
from .node import HashPlan, WholeFiles
from .signing import SignedModel, Signer
from .store import DigestStore, Listed, Prediction, Stamp, Stamped

# -- what the gate reads of the load -------------------------------------------------------------


class VerifyOptions(Signer, Protocol):
    """The options the gate reads (LoadOptions satisfies it): the verify mode and the signer
    (:class:`~tpload.verification.signing.Signer`), the kind, the config and the digest store, and
    the globs every rank must share with them (terms.py)."""

    @property
    def kind(self) -> str: ...

    @property
    def skip(self) -> Sequence[str]: ...

    @property
    def defer(self) -> Sequence[str]: ...

    @property
    def skip_activation_scales(self) -> bool: ...

    @property
    def config(self) -> str: ...

    @property
    def digest_store(self) -> str | None: ...


class Where(Protocol):
    """Where this rank stands (distributed/world.py's DistContext satisfies it)."""

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def node_peers(self) -> Sequence[int]:
        """The ranks of this rank's node, itself included."""

    @property
    def node_lists(self) -> Sequence[Sequence[int]]:
        """The group's ranks, node by node."""


class HasBytes(Protocol):
    @property
    def nbytes(self) -> int: ...


class ByteColumns(Protocol):
    """Every stored tensor's byte count as a column (model/table.py's TensorTable satisfies it)."""

    @property
    def row(self) -> Mapping[str, int]:
        """Each tensor's row."""

    @property
    def nbytes(self) -> np.ndarray:
        """Each row's stored bytes."""


class Manifest(Listed, Protocol):
    """The checkpoint's table as the gate sees it (storage's Catalogue satisfies it): the store's
    :class:`~tpload.verification.store.Listed` (the manifest's names and sha256), and more."""

    @property
    def root(self) -> Path: ...

    @property
    def manifest_path(self) -> Path: ...

    @property
    def tensors(self) -> Mapping[str, HasBytes]: ...

    @property
    def table(self) -> ByteColumns:
        """The same tensors as columns (who hashes what reads their sizes from it)."""


class Checkpoint(Stamped, Protocol):
    """The opened checkpoint as the gate sees it (storage/base.py's Storage satisfies it): what a
    stamp is taken of (:class:`~tpload.verification.store.Stamped`), and more."""

    @property
    def root(self) -> Path: ...

    @property
    def catalogue(self) -> Manifest: ...

    @property
    def per_rank(self) -> bool:
        """Each rank reads files of its own: nobody can hash for another."""

    @property
    def file_digests(self) -> Mapping[Path, str] | None:
        """Each file's whole-file sha256 the folder carries (hub blob names, local-dir etags)."""

    @property
    def file_source(self) -> FileSource | None:
        """Where :attr:`file_digests` come from, in words."""

    @property
    def anchor_files(self) -> Mapping[Path, str] | None:
        """Beside :attr:`file_digests`, what the same names or etags say of the files that shape
        the plan (``algorithm:digest``), which the anchor covers too."""

    def stored(self, name: str) -> Stored: ...

    def file_size(self, path: Path) -> int: ...

    def manifest_problems(self, names: list[str]) -> list[str]: ...

    def changed(self) -> list[str]: ...


class RankReads(Protocol):
    """One rank's plan as the gate sees it: what it reads and defers (planning's RankPlan satisfies
    it). This rank's and its node peers' together are the placement, from which who hashes what
    follows (node.py)."""

    @property
    def reads(self) -> Mapping[str, Box]:
        """Every stored tensor the rank reads a window of, and the window."""

    @property
    def deferred(self) -> Sequence[str]: ...

    @property
    def read_bytes(self) -> int: ...

    def views(self) -> Mapping[str, tuple[int, int]]:
        """Each read tensor's 2-D byte view (rows, row bytes) that its window is a box of."""


class Named(Protocol):
    @property
    def name(self) -> str: ...


class Outcome(Protocol):
    """What a rank's loop left (loading/result.py's LoadResult satisfies it)."""

    @property
    def hashed(self) -> HashResults:
        """The tensors this rank hashed, with its node peers' window fingerprints."""

    @property
    def windows(self) -> Mapping[str, tuple[Box, Triple]]:
        """Every window the rank read: its box and the fingerprint of its stored bytes."""

    @property
    def outputs(self) -> Sequence[Named]:
        """The served tensors, in plan order."""

    @property
    def fingerprints(self) -> Mapping[str, Triple]:
        """Each served tensor's fingerprint."""

    @property
    def window_columns(self) -> node.WindowColumns:
        """The same windows as columns (what the node cross-check reads)."""

    def digest(self) -> str:
        """The rank's digest of what it serves (digest.py)."""


class Provenance(Protocol):
    """Where each window a rank holds came from (a read source's: the replicas' link)."""

    def source(self, name: str) -> str:
        """Where this rank's window of ``name`` came from, in words ("" when read from
        storage)."""


class RankRow(Protocol):
    """A rank's row of the exchanged table, as the verdicts read it (model/figures.py's
    RankFigures satisfies it): the load's (terms.py's agreement, the gate's verdict) and a pushed
    version's (pushed.py: the manifest the rank verified)."""

    @property
    def rank(self) -> int: ...

    @property
    def seq(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def message(self) -> str: ...

    @property
    def digest(self) -> str: ...

    @property
    def prediction(self) -> int: ...

    @property
    def agreed(self) -> str:
        """The hashes of the terms the rank loaded under (terms.py)."""

    @property
    def pushed_version(self) -> int:
        """The version of the pushed manifest this rank took (0: none arrived)."""

    @property
    def pushed_sha256(self) -> str:
        """The sha256 (hex) of that manifest's bytes."""

    @property
    def claims(self) -> Sequence[bytes]: ...

    @property
    def seen(self) -> Sequence[bytes]: ...


# -- the job, and what the gate gives back -------------------------------------------------------


@dataclass
class Job:
    """What a strategy needs of the load in hand (filled by the load as it goes)."""

    opts: VerifyOptions
    where: Where
    checkpoint: Checkpoint
    plans: Mapping[int, RankReads]
    """This rank's plan and its node peers' (for node hashing): the placement."""
    config_id: str
    layout: Layout
    stamp: Callable[[], Stamp]
    """The checkpoint's stamp now (manifest sha256, each shard's size and mtime)."""
    notes: list[str] = field(default_factory=list)
    threads: int = 1
    """Spare cores of this rank, for hashing on the side."""
    position: int | None = None
    """This rank's place among :attr:`positions` (a stored prediction has one digest each):
    replicas stand several ranks at one position; None: its rank."""
    positions: int | None = None
    """How many digests a stored prediction holds for this load; None: the world's size."""

    @property
    def me(self) -> int:
        return self.where.rank

    @property
    def plan(self) -> RankReads:
        return self.plans[self.where.rank]


@dataclass
class Prepared:
    """What a strategy hands the copy loop: who hashes what, by which hash, and which files are
    hashed whole beside it (the read sources do the hashing: sources/)."""

    hashes: HashPlan
    digests: Digests = SHA256
    files: WholeFiles | None = None
    """Files this rank hashes whole on a thread of its own while its loop copies."""
    stored: Prediction | None = None
    """The stored prediction for this layout, when the store holds one."""


@dataclass
class Findings:
    """What a strategy settled of one rank's evidence: the load copies it into the rank's row."""

    digest: str
    prediction: PredictionState = PredictionState.NONE
    claims: list[bytes] | None = None
    """Node mode: what this rank, as hasher, says each node peer's windows hold (None: nothing
    hashed for a peer: the row's zero values stand)."""
    seen: list[bytes] | None = None
    """Node mode: what this rank read of the tensors each node peer hashed."""
    hashed: int | None = None
    """Tensors checked (whole files: the tensors fingerprinted from the hashed files); None: the
    loop's own count stands."""
    bytes_hashed: int | None = None
    """Bytes fed to the content hash (whole files: the files' bytes); None: the loop's count."""


def digest_map(digests: Mapping[str, str] | Mapping[Path, str], root: Path | None = None) -> str:
    """One sha256 over a map of files to their digests, by path relative to ``root`` (each node's
    copy may sit elsewhere; None: the names as they are), in name order."""
    lines = []
    for path, digest in digests.items():
        name = str(path)  # outside the folder (a storage never lists one): its path as it is
        if root is not None and Path(path).is_relative_to(root):
            name = Path(path).relative_to(root).as_posix()
        lines.append(f"{name}\0{digest}\n")
    return hashlib.sha256("".join(sorted(lines)).encode("utf-8", "surrogatepass")).hexdigest()


def _peer_box(peers: Mapping[str, Mapping[int, Box]]) -> Callable[[str, int], Box]:
    def box(name: str, peer: int) -> Box:
        return peers[name][peer]

    return box


def layout_key(config_id: str, layout: Layout, kind: str) -> str:
    return f"tp{layout.tp}-ep{layout.ep}-{kind}-config-{config_id}"


class Strategy(ABC):
    """One way of vouching for served bytes; see the module docstring."""

    vouched_by = ""
    locators_vouched_by = "the manifest's sha256 of the tensor"
    """What vouches for the digest a deferred tensor's locator checks (see :meth:`locators`)."""
    whole_files = False
    """Whether it vouches for whole files (then replicas share a file's windows out whole: one
    replica reads them all, and its node hashes the file once for the cluster)."""
    signed: SignedModel | None = None
    """The model.sig that vouched for the load, if one did (its bundle is then the attestation's
    identity: attest/build.py)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.prepared: Prepared | None = None
        self.provenance: Provenance | None = None
        self.key = layout_key(job.config_id, job.layout, job.opts.kind)
        manifest_sha = job.checkpoint.catalogue.manifest_sha256
        # refused here (as by the options) when it lies in the checkpoint it would vouch for
        self.store = store = DigestStore(job.opts.digest_store, checkpoint=job.checkpoint.root)
        self.store_path = str(store.path(manifest_sha)) if manifest_sha else str(store.root)

    def trust(self) -> TrustSource:
        """What this strategy checks served bytes against, as a record (model/trust.py): by
        default the manifest's per-tensor digests."""
        cat = self.job.checkpoint.catalogue
        return TrustSource(TrustKind.MANIFEST, str(cat.manifest_path), cat.manifest_sha256)

    # -- before any read ------------------------------------------------------------------------
    def signature(self) -> str:
        """The signature this load checks, by content (its bundle's sha256 and signer), the same
        on every rank checking the same one wherever it lies or whatever it is named; "none"."""
        return "none"

    def anchor(self) -> str:
        """What vouches for this load's bytes, in one line that is the same on every rank loading
        the same checkpoint through the same anchor (the handshake compares it:
        distributed/agreement.py): the manifest's sha256, else the whole-file digests the folder
        carries (hub blob names, local-dir etags) of every file the load reads and every file that
        shapes the plan (config.json, hf_quant_config.json, the index), as one sha256 over them in
        name order; "none" when it has neither."""
        checkpoint = self.job.checkpoint
        sha = checkpoint.catalogue.manifest_sha256
        if sha:
            return f"manifest sha256 {sha}"
        digests = checkpoint.file_digests
        if digests:
            source = checkpoint.file_source
            kind = source.kind if source is not None else "file"
            covered = {**digests, **(checkpoint.anchor_files or {})}
            return f"{kind} digests {digest_map(covered, checkpoint.root)}"
        return "none (no manifest, no file digests)"

    def prepare(
        self,
        reads: Mapping[int, Mapping[str, Box]] | None = None,
        *,
        provenance: Provenance | None = None,
    ) -> Prepared:
        """Check the preconditions (raise LoadError naming what is missing) and say who hashes
        what. ``reads``: each plan's windows its rank reads from storage itself (its read source's:
        replicas receive some); default: every window of each plan. ``provenance``: where each
        received window came from, for messages."""
        self.provenance = provenance
        self._check_manifest()
        if reads is None:
            reads = {p: q.reads for p, q in self.job.plans.items()}
        self.prepared = self._prepare(reads)
        self.prepared.stored = self.prepared.stored or self._stored()
        return self.prepared

    @abstractmethod
    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared: ...

    def _check_manifest(self) -> None:
        """Every tensor the plan reads or defers has the digest this strategy needs."""
        job = self.job
        plan = job.plan
        names = list(plan.reads)  # a mapping's keys: one each; deferred names may repeat them
        if plan.deferred:
            names = list(dict.fromkeys([*names, *plan.deferred]))
        problems = job.checkpoint.manifest_problems(names)
        if problems:  # listed in name order (sorted only when there is something to list)
            problems = job.checkpoint.manifest_problems(sorted(names))
            what = (  # without a manifest, they are about what else could have vouched
                "manifest problem(s)"
                if job.checkpoint.catalogue.manifest is not None
                else "problem(s) with what vouches for the bytes"
            )
            raise LoadError(f"{len(problems)} {what}:\n  - " + "\n  - ".join(problems))

    def _stored(self) -> Prediction | None:
        """The store's prediction for this layout, if any (any mode compares with one it finds)."""
        checkpoint = self.job.checkpoint
        sha = checkpoint.catalogue.manifest_sha256
        if not sha or checkpoint.per_rank:
            return None
        return self.store.read(sha).get(self.key)

    def _ready(self) -> Prepared:
        if self.prepared is None:
            raise LoadError("the gate settles only what it prepared (prepare() first)")
        return self.prepared

    # -- after the copies ----------------------------------------------------------------------
    def settle(self, outcome: Outcome, files: Sequence[FileHashed] = ()) -> Findings:
        """This rank's own verdicts (raise every problem at once), and what it settled of its
        evidence (``files``: what the whole-file hashing of :attr:`Prepared.files` found)."""
        job, prepared = self.job, self._ready()
        where, stored = job.where, prepared.stored
        found = Findings(outcome.digest())
        if stored is not None:
            me = job.position if job.position is not None else where.rank
            world = job.positions if job.positions is not None else where.world
            match = len(stored.digests) == world and stored.digests[me] == found.digest
            found.prediction = PredictionState.MATCH if match else PredictionState.DIFFERS
            if not match and len(stored.digests) == world:
                self._name_differing(outcome, stored, me, found.digest)
        hashes = prepared.hashes
        if hashes.peers or hashes.owner:
            hashed = outcome.hashed
            unhashed = hashes.mine.difference(hashed)
            if unhashed:  # the loop hashes every tensor the plan gives this rank
                raise LoadError(
                    f"{len(unhashed)} tensor(s) this rank was to hash were not hashed (a bug in "
                    f"tpload), {escape_name(min(unhashed))} among them"
                )
            peers = hashes.peers
            box = peers if isinstance(peers, node.PeerWindows) else _peer_box(peers)
            names, ranks, fps = hashed.peer_columns()
            found.claims = node.claims_of(names, ranks, fps, box, where.node_peers, where.rank)
            found.seen = node.seen_of(
                hashes.owner, outcome.window_columns, where.node_peers, where.rank
            )
        return found

    def _name_differing(self, outcome: Outcome, stored: Prediction, me: int, digest: str) -> None:
        """A digest that differs from its prediction: raise naming the served tensors that differ,
        from the per-tensor predictions stored with it (nothing to name without them)."""
        sha = self.job.checkpoint.catalogue.manifest_sha256
        if sha is None:
            return
        windows = self.store.read_windows(sha, self.key, stored.digests)
        if windows is None or len(windows) != len(stored.digests):
            return
        want, provenance = windows[me], self.provenance
        served = [o.name for o in outcome.outputs]
        bad = [n for n in served if want.get(n) != outcome.fingerprints[n]]
        bad += sorted(set(want) - set(served))
        said = [escape_name(n) + (provenance.source(n) if provenance else "") for n in bad[:8]]
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise LoadError(
            f"digest {digest[:16]}... differs from the prediction stored in "
            f"{escape_name(self.store_path)} ({self.key}, position {me}): {len(bad)} served "
            f"tensor(s) differ: {', '.join(said)}{more}"
        )

    def locators(self, names: Sequence[str]) -> dict[str, str | None]:
        """The digest each deferred tensor's locator checks its streamed bytes against."""
        stored = self.job.checkpoint.stored
        return {n: stored(n).sha256 for n in names}

    # -- after the exchange --------------------------------------------------------------------
    def verdict(self, ranks: Sequence[RankRow]) -> list[str]:
        """Problems only the exchanged table shows: a rank whose digest is not its prediction, a
        node peer that served other bytes than its hasher hashed."""
        problems = [
            f"rank {r.rank}: digest {r.digest[:16]}... differs from the prediction stored in "
            f"{escape_name(self.store_path)} ({self.key}): its memory does not hold what was "
            "verified"
            for r in ranks
            if r.prediction == PredictionState.DIFFERS
        ]
        problems += node.verdict(
            self.job.where.node_lists,
            {r.rank: r.claims for r in ranks},
            {r.rank: r.seen for r in ranks},
        )
        return problems

"""What every way of vouching for served bytes shares: the load in hand (:class:`Job`), what a
strategy hands the copy loop (:class:`Prepared`), and the :class:`Strategy` base with its three
steps (prepare, settle, verdict). The strategies themselves: gate.py (tensor digests, predictions,
none) and whole_files.py (files vouched for whole)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..distributed import placement
from ..model.errors import LoadError
from ..model.modes import PredictionState
from ..model.text import escape_name
from ..sources import replicas
from . import crosscheck
from .blake3sums import SHA256, Digests
from .files import FileHasher
from .policy import HashPlan
from .store import DigestStore, Prediction
from .trust import TrustKind, TrustSource


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
    """With replicas (sources/replicas.py): each plan's windows its rank reads from storage itself
    (default: all)."""
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


def digest_map(digests: Mapping[object, object], root: object = None) -> str:
    """One sha256 over a map of files to their digests, by path relative to ``root`` (each node's
    copy may sit elsewhere; None: the names as they are), in name order."""
    lines = []
    for path, digest in digests.items():
        name = str(path)  # outside the folder (a storage never lists one): its path as it is
        if root is not None and Path(path).is_relative_to(root):
            name = Path(path).relative_to(root).as_posix()
        lines.append(f"{name}\0{digest}\n")
    return hashlib.sha256("".join(sorted(lines)).encode("utf-8", "surrogatepass")).hexdigest()


def layout_key(config_id: str, layout: object, kind: str) -> str:
    return f"tp{layout.tp}-ep{layout.ep}-{kind}-config-{config_id}"


class Strategy(ABC):
    """One way of vouching for served bytes; see the module docstring."""

    vouched_by = ""
    locators_vouched_by = "the manifest's sha256 of the tensor"
    """What vouches for the digest a deferred tensor's locator checks (see :meth:`locators`)."""
    whole_files = False
    """Whether it vouches for whole files (then replicas share a file's windows out whole: one
    replica reads them all, and its node hashes the file once for the cluster)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.prepared: Prepared | None = None
        self.key = layout_key(job.config_id, job.layout, job.opts.kind)
        manifest_sha = job.storage.catalogue.manifest_sha256
        # refused here (as by the options) when it lies in the checkpoint it would vouch for
        self.store = store = DigestStore(job.opts.digest_store, checkpoint=job.storage.root)
        self.store_path = str(store.path(manifest_sha)) if manifest_sha else str(store.root)

    def trust(self) -> TrustSource:
        """What this strategy checks served bytes against, as a record (verification/trust.py): by
        default the manifest's per-tensor digests."""
        cat = self.job.storage.catalogue
        return TrustSource(TrustKind.MANIFEST, str(cat.manifest_path), cat.manifest_sha256)

    # -- before any read ------------------------------------------------------------------------
    def anchor(self) -> str:
        """What vouches for this load's bytes, in one line that is the same on every rank loading
        the same checkpoint through the same anchor (the handshake compares it:
        distributed/agreement.py): the manifest's sha256, else the whole-file digests the folder
        carries (hub blob names, local-dir etags), as one sha256 over them in name order; "none"
        when it has neither."""
        storage = self.job.storage
        sha = storage.catalogue.manifest_sha256
        if sha:
            return f"manifest sha256 {sha}"
        digests = getattr(storage, "file_digests", None)
        if digests:
            kind = getattr(getattr(storage, "file_source", None), "kind", "file")
            return f"{kind} digests {digest_map(digests, storage.root)}"
        return "none (no manifest, no file digests)"

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
            what = (  # without a manifest, they are about what else could have vouched
                "manifest problem(s)"
                if job.storage.catalogue.manifest is not None
                else "problem(s) with what vouches for the bytes"
            )
            raise LoadError(f"{len(problems)} {what}:\n  - " + "\n  - ".join(problems))

    def _stored(self) -> Prediction | None:
        """The store's prediction for this layout, if any (any mode compares with one it finds)."""
        storage = self.job.storage
        sha = storage.catalogue.manifest_sha256
        if not sha or storage.per_rank:
            return None
        return self.store.read(sha).get(self.key)

    # -- after the copies ----------------------------------------------------------------------
    def settle(self, result: object) -> None:
        """This rank's own verdicts (raise every problem at once) and its row's evidence figures."""
        fig, ctx, stored = self.job.fig, self.job.ctx, self.prepared.stored
        fig.digest = result.digest()
        # the attestation is an exit path of the gate: rank 0's row says it will write one
        fig.attest = int(bool(getattr(self.job.opts, "attest", None)))
        if stored is not None:
            at = placement.placement(
                self.job.opts, ctx.world
            )  # replicas: one prediction a position
            me, world = (at.where(ctx.rank)[1], at.size) if at else (ctx.rank, ctx.world)
            match = len(stored.digests) == world and stored.digests[me] == fig.digest
            fig.prediction = PredictionState.MATCH if match else PredictionState.DIFFERS
            if not match and len(stored.digests) == world:
                self._name_differing(result, stored, me)
        hashes = self.prepared.hashes
        if hashes.peers or hashes.owner:
            fingerprints = result.hashed.column("peers")
            fig.claims = crosscheck.claims(hashes.peers, fingerprints, ctx.node_peers, ctx.rank)
            fig.seen = crosscheck.seen(hashes.owner, result.windows, ctx.node_peers, ctx.rank)

    def _name_differing(self, result: object, stored: Prediction, me: int) -> None:
        """A digest that differs from its prediction: raise naming the served tensors that differ,
        from the per-tensor predictions stored with it (nothing to name without them)."""
        sha = self.job.storage.catalogue.manifest_sha256
        windows = self.store.read_windows(sha, self.key, stored.digests)
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
            problems += replicas.verdict(ranks, placement.placement(self.job.opts, len(ranks)))
        return problems

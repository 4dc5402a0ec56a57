"""The optional second digest: blake3 of every tensor, kept by the operator beside the trusted
digests.

blake3 is several times faster than sha256 on one thread, and it can spread one
large tensor over several (docs/benchmarks.md has the figures).
``tpload manifest DIR --hash blake3`` checks every tensor's sha256 against the manifest and,
only if all match, keeps a blake3 of each, taken from the very same bytes, in the operator's
digest store (store.py: the same folder, trust and permission checks as stored predictions):

    <store>/<manifest sha256>.blake3.json
    {"format": 1, "hash": "blake3", "manifest_sha256": ..., "checkpoint": "/path (informational)",
     "verified": {stamp}, "tensors": {name: blake3 hex}}

The checkpoint folder and the manifest's bytes are unchanged, so a pin and stored
predictions stay valid. A load in ``node`` or ``rank`` mode then proves bytes by
blake3 against this file instead of sha256 against the manifest, when the file is
fresh (same stamp: the manifest's sha256, each shard's size and mtime) and holds
every tensor the manifest lists; otherwise by sha256, and the report says why.
The rule reads only the sidecar and the manifest, so every rank that sees the same
store decides the same; the exchanged figures say which hash each rank used.

The package is an optional extra (``pip install -e ".[blake3]"`` in tpload's clone): without it
tpload works as before, and ``--hash blake3`` says how to get it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import LoadError
from ..model.text import escape_name
from ..storage.catalogue import Catalogue
from .store import DigestStore, stale
from .vouched import Vouched

try:  # an optional extra: tpload works without it
    import blake3 as _blake3
except ImportError:  # pragma: no cover - depends on the environment
    _blake3 = None

FORMAT = 1
INSTALL = 'pip install blake3 (or, in tpload\'s clone, pip install -e ".[blake3]")'
THREADED_FROM = (
    4 << 20
)  # a tensor this big is hashed on several threads when the rank has cores to spare


def available() -> bool:
    return _blake3 is not None


def require() -> None:
    """Raise a clear LoadError when the blake3 package is missing."""
    if _blake3 is None:
        raise LoadError(
            f"--hash blake3 needs the blake3 package, which is not installed: {INSTALL}"
        )


def new_blake3(nbytes: int, threads: int) -> object:
    """A blake3 hasher for a tensor of ``nbytes``: on up to ``threads`` threads when it is large."""
    require()
    return _blake3.blake3(max_threads=max(1, threads) if nbytes >= THREADED_FROM else 1)


def sidecar_path(store: DigestStore, manifest_sha256: str) -> Path:
    return store.root / f"{manifest_sha256}.blake3.json"


def fix_command(root: str | Path, store: str | Path | None) -> str:
    """The command that (re)writes the sidecar."""
    return (
        f"`python -m tpload manifest {escape_name(root)} --hash blake3"
        + (f" --digest-store {escape_name(store)}" if store else "")
        + "`"
    )


@dataclass(frozen=True)
class Sidecar:
    """A checkpoint's blake3 digests, as the operator's store keeps them."""

    path: Path
    tensors: Mapping[str, str]
    stamp: dict


def write_sidecar(
    store: DigestStore, manifest_sha256: str, checkpoint: Path, checked: Vouched, stamp: dict
) -> Path:
    """Keep the blake3 of every tensor the gate ``checked`` (gate.at_rest: each sha256 matched the
    manifest with this sha256, and the blake3 was taken of the same bytes)."""
    if not isinstance(checked, Vouched) or "blake3" not in checked.also:
        raise LoadError(
            "a blake3 sidecar is written only from tensors the gate checked, with their blake3"
        )
    doc = {
        "format": FORMAT,
        "hash": "blake3",
        "manifest_sha256": manifest_sha256,
        "checkpoint": str(checkpoint),
        "verified": stamp,
        "tensors": dict(sorted(checked.hexes("blake3").items())),
    }
    return store.replace_doc(sidecar_path(store, manifest_sha256), doc)


def read_sidecar(store: DigestStore, manifest_sha256: str, *, fix: str = "") -> Sidecar | None:
    """The sidecar of the manifest with this sha256 (None if there is none), after the store's
    checks."""
    path = sidecar_path(store, manifest_sha256)
    doc = store.read_doc(
        path, manifest_sha256, f"write it again with {fix or fix_command('DIR', None)}"
    )
    if doc is None:
        return None
    tensors, stamp = doc.get("tensors"), doc.get("verified")
    if (
        doc.get("hash") != "blake3"
        or not isinstance(tensors, dict)
        or not isinstance(stamp, dict)
        or not all(isinstance(v, str) and len(v) == 64 for v in tensors.values())
    ):
        raise LoadError(
            f"{escape_name(path)}: not a blake3 sidecar (hash, tensors of 64 hex digits, verified "
            "stamp); "
            f"remove it and write it again with {fix or fix_command('DIR', None)}"
        )
    return Sidecar(path, {str(k): v.lower() for k, v in tensors.items()}, stamp)


@dataclass(frozen=True)
class Digests:
    """The content hash that proves a tensor's bytes, and what it must equal.

    ``sha256`` (the default): the manifest's, held in each :class:`~tpload.storage.Stored`.
    ``blake3``: ``want`` (the sidecar's, read from ``source``). ``also``: hashes taken along from
    the same bytes and kept, not compared (``manifest --hash blake3`` takes blake3 while it checks
    sha256)."""

    hash: str = "sha256"
    want: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    threads: int = 1
    """blake3: threads for one large tensor (the rank's spare cores)."""
    also: tuple[str, ...] = ()

    @property
    def hashes(self) -> tuple[str, ...]:
        return (self.hash, *self.also)

    def expected(self, name: str, manifest_sha256: str | None) -> str | None:
        return manifest_sha256 if self.hash == "sha256" else self.want.get(name)

    def mismatch(self, path: Path | str, name: str, got: str, want: str) -> str:
        """The blake3 wording of a failed check (sha256's is catalogue.sha256_mismatch)."""
        return (
            f"{escape_name(path)}: tensor {escape_name(name)}: blake3 {got[:16]}... does not match "
            f"{want[:16]}... from {escape_name(self.source)} (the blake3 sidecar, written after "
            "every sha256 matched the manifest)"
        )


SHA256 = Digests()


def content_hash(
    store: DigestStore, catalogue: Catalogue, stamp: Callable[[], dict], *, threads: int, fix: str
) -> tuple[Digests, str]:
    """blake3 when the store holds a fresh sidecar for this manifest that covers every tensor it
    lists, sha256 otherwise; and, when a sidecar exists but is not used, why (a report note).
    ``stamp``: the checkpoint's stamp now (taken only when there is a sidecar to compare it
    with)."""
    sha = catalogue.manifest_sha256
    if sha is None or catalogue.manifest is None:
        return SHA256, ""
    side = read_sidecar(store, sha, fix=fix)
    if side is None:
        return SHA256, ""
    why = ""
    missing = [n for n in catalogue.manifest if n not in side.tensors]
    changed = stale(side.stamp, stamp())
    if not available():
        why = f"the blake3 package is not installed ({INSTALL})"
    elif changed:
        why = (
            f"{', '.join(changed)} changed (size or mtime) since it was written; rewrite it "
            f"with {fix}"
        )
    elif missing:
        why = (
            f"it lacks {len(missing)} of the manifest's tensors (first "
            f"{escape_name(missing[0])}); rewrite it with {fix}"
        )
    if why:
        return (
            SHA256,
            f"blake3 sidecar {escape_name(side.path)} not used, tensors checked by sha256: {why}",
        )
    return Digests("blake3", side.tensors, str(side.path), threads=threads), ""

"""Trusted digests: what ``tpload plan --write`` verified by sha256, kept where the checkpoint's
writer cannot reach.

A ``--verify digest`` load hashes nothing: it trusts digests written after
every tensor the layout uses was hashed against the manifest, and checks every
served byte against them through the fingerprints. Whoever can write those
digests decides what is served, so they are never read from the checkpoint
folder: they live in the operator's own store (``$XDG_STATE_HOME/tpload``, else
``~/.local/state/tpload``, or ``digest_store=``), a folder of mode 0700 with
files of mode 0600, owned by the user who loads; a store that others can
write is refused, and so is a store inside the checkpoint it would vouch for
(spelled directly, through a symlink, or by ``$XDG_STATE_HOME``): its writer
could write the digests too. One file per checkpoint, named by its manifest's sha256:

    {"format": 3, "manifest_sha256": ..., "checkpoint": "/path (informational)",
     "layouts": {"tp2-ep1-packed-config-<id>": {"digests": [...], "verified": {stamp}}}}

The stamp (the manifest's sha256, each shard's size and mtime) makes an entry
stale once a shard is rewritten. Beside it, ``<sha256>.<layout key>.windows`` (JSON) holds each
rank's fingerprint of every tensor it serves (the lines its digest is made of), written by the same
``plan --write``: read only when a rank's digest differs, so that the mismatch names its tensors.
Writes take a lock, write beside the file and rename: never a half-written store, never a lost
update.

The optional second digest: blake3 of every tensor, kept beside the trusted digests. blake3 is
several times faster than sha256 on one thread, and it can spread one large tensor over several
(docs/benchmarks.md has the figures). ``tpload manifest DIR --hash blake3`` checks every tensor's
sha256 against the manifest and, only if all match, keeps a blake3 of each, taken from the very
same bytes, in the same store (the same folder, trust and permission checks):

    <store>/<manifest sha256>.blake3.json
    {"format": 1, "hash": "blake3", "manifest_sha256": ..., "checkpoint": "/path (informational)",
     "verified": {stamp}, "tensors": {name: blake3 hex}}

The checkpoint folder and the manifest's bytes are unchanged, so a pin and stored predictions stay
valid. A load in ``node`` or ``rank`` mode then proves bytes by blake3 against this file instead of
sha256 against the manifest, when the file is fresh (same stamp: the manifest's sha256, each shard's
size and mtime) and holds every tensor the manifest lists; otherwise by sha256, and the report says
why (:func:`content_hash`). The rule reads only the sidecar and the manifest, so every rank that
sees the same store decides the same; the exchanged figures say which hash each rank used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

from ..model.errors import LoadError
from ..model.text import escape_name
from ..model.values import Json
from ..storage.files import atomic_write, read_json, report_in_checkpoint
from .hashes import INSTALL, SHA256, Digests, available
from .vouched import Vouched

FORMAT = 3
SIDECAR_FORMAT = 1


class Stamp(TypedDict):
    """What a verified prediction (or sidecar) vouches for: the manifest's sha256 and each shard's
    size and mtime (in nanoseconds), by file name."""

    manifest_sha256: str | None
    shards: dict[str, list[int]]


Doc = dict[str, object]
"""A JSON document of the store, as read (each field narrowed where it is used)."""


class Listed(Protocol):
    """A catalogue as the store reads it (storage's Catalogue satisfies it)."""

    @property
    def manifest_sha256(self) -> str | None:
        """The sha256 of the manifest's bytes as read (the checkpoint's identity)."""

    @property
    def manifest(self) -> Collection[str] | None:
        """The manifest's tensor names (None: no manifest)."""


class Stamped(Protocol):
    """What a stamp is taken of (a storage satisfies it)."""

    @property
    def catalogue(self) -> Listed: ...

    def paths(self) -> list[Path]: ...


def checkpoint_stamp(storage: Stamped) -> Stamp:
    """What a verified prediction vouches for: the manifest's sha256 and each shard's size and
    mtime."""
    shards = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(storage.paths())}
    return {"manifest_sha256": storage.catalogue.manifest_sha256, "shards": shards}


def default_store() -> Path:
    """``$XDG_STATE_HOME/tpload`` (an empty variable counts as unset), else
    ``~/.local/state/tpload``."""
    state = os.environ.get("XDG_STATE_HOME") or ""
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "tpload"


def default_spelled() -> str:
    """How :func:`default_store` was found, for messages."""
    state = os.environ.get("XDG_STATE_HOME") or ""
    return "$XDG_STATE_HOME/tpload" if os.path.isabs(state) else "~/.local/state/tpload"


HUB_REPOS = ("models--", "datasets--", "spaces--")
"""How a Hugging Face hub cache names a repository's folder (``hub/models--ORG--NAME``, holding
``blobs/``, ``snapshots/``, ``refs/``): whoever downloads into it writes there."""


def in_hub_cache(path: Path) -> str | None:
    """Why ``path`` lies inside a hub cache repository's folder (spelled directly or through
    symlinks), or None: any snapshot of it is written by the downloads into that folder, so digests
    kept there would be vouched for by what they vouch for."""
    try:
        spellings = {Path(os.path.abspath(path)), path.resolve()}
    except (OSError, RuntimeError) as e:  # a symlink loop: refuse rather than guess
        return f"cannot be resolved ({e})"
    for spelled in spellings:
        for folder in (spelled, *spelled.parents):
            if folder.name.startswith(HUB_REPOS):
                return f"is inside the hub cache repository {escape_name(folder)}"
    return None


def in_checkpoint(
    root: str | os.PathLike[str] | None, checkpoint: str | os.PathLike[str]
) -> str | None:
    """Why the digest store ``root`` (None: the default) lies in the checkpoint folder
    ``checkpoint`` (inside it, through symlinks too, or one of its entries) or in a hub cache's
    repository folder (:func:`in_hub_cache`: its blobs, snapshots, refs), in words naming the
    store; None when it does not."""
    path = Path(root) if root else default_store()
    why = in_hub_cache(path) or report_in_checkpoint(str(path), str(checkpoint))
    if why is None:
        return None
    said = "" if root else f" (the default, {default_spelled()})"
    return (
        f"the digest store {escape_name(path)}{said} {why}; trusted digests never live in the "
        "checkpoint they vouch for (whoever writes it could write them too)"
    )


@dataclass(frozen=True)
class Prediction:
    """One layout's stored digests, and what they were verified against (None: not verified)."""

    digests: list[str]
    stamp: Mapping[str, object] | None = None


def _check_private(path: Path, what: str) -> None:
    """Refuse a store path another user could have written (owner, group/other write bits)."""
    st = os.stat(path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise LoadError(
            f"{escape_name(path)}: {what} belongs to uid {st.st_uid}, not to this user "
            f"({os.getuid()}); "
            "trusted digests must be the operator's own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LoadError(
            f"{escape_name(path)}: {what} is writable by others "
            f"(mode {stat.S_IMODE(st.st_mode):o}); "
            "refused: whoever can write it decides what is served"
        )


class DigestStore:
    """The operator's store of trusted digests (see the module doc)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        """``checkpoint``: the folder the store is about to vouch for; a store inside it is
        refused (LoadError) before it is read or written."""
        self.root = Path(root) if root else default_store()
        if checkpoint is not None and (why := in_checkpoint(root, checkpoint)):
            raise LoadError(
                f"{why}: give --digest-store (digest_store=) a folder outside the checkpoint"
            )

    def path(self, manifest_sha256: str) -> Path:
        return self.root / f"{manifest_sha256}.json"

    def read(self, manifest_sha256: str) -> dict[str, Prediction]:
        """Every stored layout of the checkpoint whose manifest has this sha256 ({} if none)."""
        doc = self.read_doc(
            self.path(manifest_sha256),
            manifest_sha256,
            "write them again with `python -m tpload plan DIR --tp T --write`",
        )
        if doc is None:
            return {}
        try:
            layouts = doc["layouts"]
            if not isinstance(layouts, dict):
                raise TypeError("layouts is not an object")
            return {
                str(k): Prediction([str(d) for d in v["digests"]], _stamp_of(v.get("verified")))
                for k, v in layouts.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _unreadable(
                self.path(manifest_sha256),
                e,
                "write them again with `python -m tpload plan DIR --tp T --write`",
            ) from None

    def read_doc(self, path: Path, manifest_sha256: str, fix: str) -> Doc | None:
        """The JSON document at ``path`` in this store (None if there is none), after the store's
        trust checks; it must name the manifest with this sha256. ``fix``: how to write it again."""
        if not os.path.lexists(path):
            return None
        if path.is_symlink():  # tpload writes each one as a regular file (storage/files.py)
            raise LoadError(
                f"{escape_name(path)}: the digest file is a symlink (to "
                f"{escape_name(os.path.realpath(path))}); refused: tpload writes its digest files "
                "as regular files, and whoever controls where a link points (the checkpoint's "
                f"writer, if it points there) would decide what is trusted; remove the link"
                + (f", then {fix}" if fix else "")
            )
        _check_private(self.root, "the digest store")
        _check_private(path, "the digest file")
        try:  # the bounded reader: a FIFO or a device planted in the store is refused by name
            doc = read_json(path, "digest file")
            if not isinstance(doc, dict) or doc.get("manifest_sha256") != manifest_sha256:
                raise ValueError("it names another manifest")
            return {str(k): v for k, v in doc.items()}
        except (LoadError, ValueError) as e:
            raise _unreadable(path, e, fix) from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(self.root, "the digest store")
        path = self.root / ".lock"
        # O_NONBLOCK and O_NOFOLLOW: a FIFO or a link planted as the lock can neither block the
        # open nor point it elsewhere; fstat refuses anything but a regular file
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as e:
            raise LoadError(
                f"{escape_name(path)}: the digest store's lock cannot be opened ({e.strerror}); "
                "refused"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LoadError(
                    f"{escape_name(path)}: the digest store's lock is not a regular file; refused"
                )
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def write(
        self, manifest_sha256: str, checkpoint: Path, key: str, digests: list[str], stamp: Stamp
    ) -> Path:
        """Store ``digests`` for ``key`` (read-modify-write under a lock, atomic replace, mode
        0600)."""
        path = self.path(manifest_sha256)
        with self._locked():
            layouts = {
                k: {"digests": v.digests, "verified": v.stamp}
                for k, v in self.read(manifest_sha256).items()
            }
            layouts[key] = {"digests": digests, "verified": stamp}
            doc = {
                "format": FORMAT,
                "manifest_sha256": manifest_sha256,
                "checkpoint": str(checkpoint),
                "layouts": layouts,
            }
            atomic_write(path, json.dumps(doc, indent=1) + "\n", mode=0o600)
        return path

    def windows_path(self, manifest_sha256: str, key: str) -> Path:
        return self.root / f"{manifest_sha256}.{key}.windows"

    def write_windows(
        self,
        manifest_sha256: str,
        key: str,
        digests: list[str],
        windows: Sequence[Mapping[str, Sequence[int]]],
    ) -> Path:
        """Each rank's fingerprint of every served tensor (``windows[rank][name]``: the triple),
        tied to the rank ``digests`` stored with them."""
        doc = {
            "format": FORMAT,
            "manifest_sha256": manifest_sha256,
            "layout": key,
            "digests": digests,
            "windows": windows,
        }
        path = self.windows_path(manifest_sha256, key)
        with self._locked():  # compact: one line a tensor a rank adds up at full size
            atomic_write(path, json.dumps(doc, separators=(",", ":")) + "\n", mode=0o600)
        return path

    def read_windows(
        self, manifest_sha256: str, key: str, digests: list[str]
    ) -> list[dict[str, tuple[int, ...]]] | None:
        """The per-tensor predictions stored with ``digests`` (None: none, or written with other
        digests)."""
        path = self.windows_path(manifest_sha256, key)
        doc = self.read_doc(path, manifest_sha256, "write them again with `tpload plan --write`")
        if doc is None or doc.get("digests") != digests or doc.get("layout") != key:
            return None
        try:
            windows = doc["windows"]
            if not isinstance(windows, list):
                raise TypeError("windows is not a list")
            return [{str(n): tuple(map(int, t)) for n, t in w.items()} for w in windows]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _unreadable(path, e, "write them again with `tpload plan --write`") from None

    def replace_doc(self, path: Path, doc: Doc) -> Path:
        """Write ``doc`` whole at ``path`` in this store (under the lock, atomic replace, mode
        0600)."""
        with self._locked():
            atomic_write(path, json.dumps(doc, indent=1) + "\n", mode=0o600)
        return path


def _unreadable(path: Path, e: Exception, fix: str) -> LoadError:
    return LoadError(
        f"{escape_name(path)}: stored digests are unreadable ({escape_name(e)}); remove the file "
        f"and {fix}"
    )


def _stamp_of(value: Json) -> Mapping[str, object] | None:
    """A stored stamp as read (None: never verified; anything but an object is unreadable)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("verified is not an object")
    return value


def stale(stamp: Mapping[str, object] | None, now: Stamp) -> list[str]:
    """What changed since ``stamp`` was taken (manifest, shards by size and mtime); [] if
    nothing."""
    if stamp is None:
        return ["the entry was never verified by sha256"]
    then = stamp.get("shards", {})
    shards: Mapping[str, object] = then if isinstance(then, dict) else {}
    changed = [
        f"shard {escape_name(name)}"
        for name in sorted(set(now["shards"]) | set(shards))
        if now["shards"].get(name) != shards.get(name)
    ]
    if now["manifest_sha256"] != stamp.get("manifest_sha256"):
        changed.insert(0, "the manifest")
    return changed


# -- the blake3 sidecar ----------------------------------------------------------------------------


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
    stamp: Mapping[str, object]


def write_sidecar(
    store: DigestStore, manifest_sha256: str, checkpoint: Path, checked: Vouched, stamp: Stamp
) -> Path:
    """Keep the blake3 of every tensor the gate ``checked`` (gate.at_rest: each sha256 matched the
    manifest with this sha256, and the blake3 was taken of the same bytes)."""
    if not isinstance(checked, Vouched) or "blake3" not in checked.also:
        raise LoadError(
            "a blake3 sidecar is written only from tensors the gate checked, with their blake3"
        )
    doc: Doc = {
        "format": SIDECAR_FORMAT,
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
    return Sidecar(path, {str(k): str(v).lower() for k, v in tensors.items()}, stamp)


def content_hash(
    store: DigestStore, catalogue: Listed, stamp: Callable[[], Stamp], *, threads: int, fix: str
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

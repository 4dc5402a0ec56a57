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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..model.errors import LoadError
from ..model.text import escape_name
from ..storage.files import atomic_write, read_json, report_in_checkpoint

if TYPE_CHECKING:
    from ..storage.base import Storage

FORMAT = 3


def checkpoint_stamp(storage: Storage) -> dict:
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


def in_checkpoint(root: str | os.PathLike | None, checkpoint: str | os.PathLike) -> str | None:
    """Why the digest store ``root`` (None: the default) lies in the checkpoint folder
    ``checkpoint`` (inside it, through symlinks too, or one of its entries), in words naming the
    store; None when it does not."""
    path = Path(root) if root else default_store()
    why = report_in_checkpoint(str(path), str(checkpoint))
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
    stamp: dict | None = None


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
        root: str | os.PathLike | None = None,
        *,
        checkpoint: str | os.PathLike | None = None,
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
            return {
                k: Prediction([str(d) for d in v["digests"]], v.get("verified"))
                for k, v in doc["layouts"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _unreadable(
                self.path(manifest_sha256),
                e,
                "write them again with `python -m tpload plan DIR --tp T --write`",
            ) from None

    def read_doc(self, path: Path, manifest_sha256: str, fix: str) -> dict | None:
        """The JSON document at ``path`` in this store (None if there is none), after the store's
        trust checks; it must name the manifest with this sha256. ``fix``: how to write it again."""
        if not path.exists():
            return None
        _check_private(self.root, "the digest store")
        _check_private(path, "the digest file")
        try:  # the bounded reader: a FIFO or a device planted in the store is refused by name
            doc = read_json(path, "digest file")
            if not isinstance(doc, dict) or doc.get("manifest_sha256") != manifest_sha256:
                raise ValueError("it names another manifest")
            return doc
        except (LoadError, ValueError) as e:
            raise _unreadable(path, e, fix) from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(self.root, "the digest store")
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def write(
        self, manifest_sha256: str, checkpoint: Path, key: str, digests: list[str], stamp: dict
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
        self, manifest_sha256: str, key: str, digests: list[str], windows: list[dict]
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

    def read_windows(self, manifest_sha256: str, key: str, digests: list[str]) -> list[dict] | None:
        """The per-tensor predictions stored with ``digests`` (None: none, or written with other
        digests)."""
        path = self.windows_path(manifest_sha256, key)
        doc = self.read_doc(path, manifest_sha256, "write them again with `tpload plan --write`")
        if doc is None or doc.get("digests") != digests or doc.get("layout") != key:
            return None
        try:
            return [{str(n): tuple(map(int, t)) for n, t in w.items()} for w in doc["windows"]]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _unreadable(path, e, "write them again with `tpload plan --write`") from None

    def replace_doc(self, path: Path, doc: dict) -> Path:
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


def stale(stamp: dict | None, now: dict) -> list[str]:
    """What changed since ``stamp`` was taken (manifest, shards by size and mtime); [] if
    nothing."""
    if stamp is None:
        return ["the entry was never verified by sha256"]
    changed = [
        f"shard {escape_name(name)}"
        for name in sorted(set(now["shards"]) | set(stamp.get("shards", {})))
        if now["shards"].get(name) != stamp.get("shards", {}).get(name)
    ]
    if now["manifest_sha256"] != stamp.get("manifest_sha256"):
        changed.insert(0, "the manifest")
    return changed

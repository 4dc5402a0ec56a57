"""A ``huggingface_hub`` local-dir download: each file's download metadata names its expected
digest.

``hf download ORG/MODEL --local-dir DIR`` (and ``snapshot_download(local_dir=...)``) writes the
files themselves into ``DIR`` and, for each, ``DIR/.cache/huggingface/download/<path>.metadata``:
three lines, the commit hash, the etag and the time the metadata was written (huggingface_hub's
``_local_folder.py``). For a file stored in Git LFS (every safetensors shard) the etag is the sha256
of its bytes; for a plain git file (the JSON files) it is the git blob SHA-1. So such a folder, like
a hub cache snapshot (:mod:`.hub`), carries an expected digest per file: shards are hashed whole
while the load reads them (whole_files.FileDigests), the JSON files that shape a plan are checked
now.

huggingface_hub itself trusts the metadata only while the file's mtime is at most 1 s newer than
the metadata's timestamp (else it hashes the file again). tpload needs no such shortcut: the etag
is the digest of the bytes, and every file it vouches for is hashed against it (a shard whole while
the load reads it, a JSON file before it is parsed), so a download copied with ``cp -r`` (every
mtime changed) is still vouched for by its etags. Only a file *stale* by that rule whose bytes no
longer match its etag (modified since its download) is unvouched, as is one with no metadata or
metadata that cannot be read: without NATIVE_MANIFEST.json the load is refused, naming each one
(:meth:`LocalDir.problems`); with one, the manifest vouches for it. An etag proves the file is
what the hub served for that commit (corruption since the download is caught), not that a writer of
the folder left it alone: they can rewrite the metadata too (docs/threat-model.md).
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import MANIFEST_NAME, FileSource
from .hub import Blob, check_small, read_checked
from .pins import PLAN_FILES

DOWNLOAD_DIR = Path(".cache") / "huggingface" / "download"
MAX_METADATA_BYTES = 4096
"""The three lines are about 120 bytes; anything much larger is not huggingface_hub's."""
SLACK_S = 1.0
"""huggingface_hub's own allowance: fresh while ``st_mtime - 1 <= timestamp`` (mtime is not
precise)."""
_ETAG = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class Metadata:
    """One file's download metadata, as huggingface_hub's ``read_download_metadata`` parses it."""

    path: Path
    """The metadata file."""
    commit: str
    blob: Blob
    """The etag: ``sha256`` (64 hex digits, an LFS file) or ``git-sha1`` (40, a plain git file)."""
    timestamp: float
    stale: bool = False
    """The file was modified (or copied: ``cp -r``) after its metadata was written, as
    huggingface_hub judges it: its etag is believed only once the file's bytes hash to it."""


def _named(meta: Metadata) -> str:
    return f"its local-dir etag ({escape_name(meta.path)}) is"


def download_dir(root: Path) -> Path:
    return root / DOWNLOAD_DIR


def is_local_dir(root: Path) -> bool:
    """Whether ``root`` has huggingface_hub's download metadata folder (a link counts: it is then
    refused file by file, naming it, rather than the folder silently read as a plain one)."""
    return os.path.lexists(download_dir(root))


def metadata_path(root: Path, rel: str) -> Path:
    return download_dir(root) / f"{rel}.metadata"


def read_metadata(root: Path, rel: str) -> Metadata | None:
    """``rel``'s metadata (None: it has none); CheckpointError, one line naming the metadata file,
    for one that is not a regular file inside ``root``, is too large, or does not parse as
    huggingface_hub writes it (a commit line, an etag of 40 or 64 hex digits, a finite
    timestamp)."""
    path = metadata_path(root, rel)
    if not os.path.lexists(path):
        return None
    where = escape_name(path)
    real = Path(os.path.realpath(path))
    if path.is_symlink() or not real.is_relative_to(Path(os.path.realpath(root))):
        what = "is a link" if path.is_symlink() else "lies out of the folder"
        raise CheckpointError(
            f"{where}: download metadata {what} (at {escape_name(real)}); huggingface_hub writes "
            "regular files inside the folder, so it is not trusted"
        )
    try:  # O_NOFOLLOW: no link swapped in after the check; O_NONBLOCK: a FIFO cannot block the open
        fd = os.open(
            path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        )
    except OSError as e:
        why = "is a link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        raise CheckpointError(f"{where}: download metadata {why}; not trusted") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: download metadata is not a regular file; not trusted")
        if st.st_size > MAX_METADATA_BYTES:
            raise CheckpointError(
                f"{where}: download metadata is {st.st_size} bytes, not three short lines "
                f"(at most {MAX_METADATA_BYTES}); not trusted"
            )
        raw = os.pread(fd, MAX_METADATA_BYTES + 1, 0)
    finally:
        os.close(fd)
    return parse_metadata(raw, path)


def parse_metadata(raw: bytes, path: Path) -> Metadata:
    """The three lines (huggingface_hub reads each with ``readline().strip()``; more are
    ignored)."""
    where = escape_name(path)
    try:
        lines = raw.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise CheckpointError(
            f"{where}: download metadata is not ASCII text; not trusted"
        ) from None
    if len(lines) < 3:
        raise CheckpointError(
            f"{where}: download metadata has {len(lines)} line(s), not three (commit, etag, "
            "timestamp); not trusted"
        )
    commit, etag, when = (s.strip() for s in lines[:3])
    if not commit:
        raise CheckpointError(
            f"{where}: download metadata has no commit hash on its first line; not trusted"
        )
    if not _ETAG.fullmatch(etag):
        raise CheckpointError(
            f"{where}: download metadata's etag {escape_name(etag[:80])} is not a sha256 (64 hex "
            "digits) or a git SHA-1 (40); not trusted"
        )
    try:
        timestamp = float(when)
    except ValueError:
        timestamp = math.nan
    if not math.isfinite(timestamp):
        raise CheckpointError(
            f"{where}: download metadata's timestamp {escape_name(when[:40])} is not a number of "
            "seconds; not trusted"
        )
    algorithm = "sha256" if len(etag) == 64 else "git-sha1"
    return Metadata(path, commit, Blob(algorithm, etag.lower()), timestamp)


def judge(root: Path, rel: str, *, stale_ok: bool = False) -> Metadata | str:
    """``rel``'s fresh metadata, or why nothing vouches for it (one line, naming the file).
    ``stale_ok``: metadata stale by huggingface_hub's rule is returned too, marked ``stale`` (its
    etag then vouches only for bytes that hash to it)."""
    name = escape_name(rel)
    try:
        meta = read_metadata(root, rel)
    except CheckpointError as e:
        return f"{name}: {e}"
    if meta is None:
        return f"{name}: no download metadata ({escape_name(DOWNLOAD_DIR / rel)}.metadata)"
    try:
        mtime = os.stat(root / rel).st_mtime
    except OSError as e:
        return f"{name}: cannot stat it ({e.strerror})"
    if mtime - SLACK_S > meta.timestamp:  # huggingface_hub's rule, word for word
        if stale_ok:
            return dataclasses.replace(meta, stale=True)
        return (
            f"{name}: stale download metadata: the file was modified {mtime - meta.timestamp:.1f} "
            "s after its metadata was written (huggingface_hub ignores it then too), so its etag "
            "no longer vouches for it"
        )
    return meta


@dataclass
class LocalDir:
    """What a local-dir download's metadata vouches for: each judged file's etag, or why not."""

    root: Path
    fresh: dict[str, Metadata] = field(default_factory=dict)
    """{file: the metadata whose etag it is checked against} (stale ones too,
    :attr:`Metadata.stale`: a JSON file's bytes are checked now, a shard's as the load hashes it
    whole)."""
    unvouched: dict[str, str] = field(default_factory=dict)
    """{file: why nothing vouches for it} (no metadata, unreadable, modified since the download)."""
    digests: dict[Path, str] = field(default_factory=dict)
    """Each vouched shard's expected sha256 (:meth:`shard_digests`)."""

    def judge(self, files: list[str]) -> LocalDir:
        for rel in files:
            got = judge(self.root, rel, stale_ok=True)
            if isinstance(got, Metadata):
                self.fresh[rel] = got
            else:
                self.unvouched[rel] = got
        return self

    def check_small_files(self) -> dict[str, bytes]:
        """Check the JSON files that shape a plan (and a manifest that came with the download) by
        their git SHA-1 etags, before anything reads them; every mismatch listed at once; the bytes
        of each file that passed, as checked. Files without fresh metadata are left to
        :meth:`problems` (refused without a manifest, pinned by one otherwise)."""
        present = [n for n in (*PLAN_FILES, MANIFEST_NAME) if os.path.lexists(self.root / n)]
        self.judge(present)
        if (
            MANIFEST_NAME in self.unvouched
        ):  # the operator's own (`tpload manifest`): read as any folder's
            del self.unvouched[MANIFEST_NAME]
        problems = []
        checked: dict[str, bytes] = {}
        for name in present:
            meta = self.fresh.get(name)
            if meta is not None:
                try:
                    checked[name] = read_checked(self.root / name, meta.blob, named=_named(meta))
                except CheckpointError as e:
                    if meta.stale:  # modified since its download: a manifest may vouch for it
                        self._modified(name, str(e))
                    else:
                        problems.append(str(e))
        if problems:
            raise CheckpointError(
                "\n".join(problems)
                if len(problems) == 1
                else f"{len(problems)} file(s) do not match their local-dir etags:\n  - "
                + "\n  - ".join(problems)
            )
        return checked

    def shard_digests(self, shards: list[str]) -> dict[Path, str]:
        """Each vouched shard's expected sha256 (its etag), by path; a shard stored as a plain git
        object (no LFS) is checked whole by its SHA-1 now, and expected to keep the sha256 of the
        bytes checked."""
        self.judge(shards)
        for shard in shards:
            meta = self.fresh.get(shard)
            if meta is None:
                continue
            if meta.blob.algorithm == "sha256":  # hashed whole as the load reads it
                self.digests[self.root / shard] = meta.blob.digest
                continue
            try:
                self.digests[self.root / shard] = check_small(
                    self.root / shard, meta.blob, named=_named(meta)
                )
            except CheckpointError as e:
                if not meta.stale:
                    raise
                self._modified(shard, str(e))
        return self.digests

    def fresh_digests(self) -> dict[Path, str]:
        """:attr:`digests` of the shards whose metadata is fresh (huggingface_hub's rule): what
        ``tpload manifest`` holds the files to; one modified or copied since its download it
        vouches for as it is now."""
        return {
            path: d
            for path, d in self.digests.items()
            if not self.fresh[path.relative_to(self.root).as_posix()].stale
        }

    def _modified(self, rel: str, why: str) -> None:
        """``rel``, stale by huggingface_hub's rule, does not match its etag: modified since its
        download, so its etag vouches for nothing."""
        del self.fresh[rel]
        self.unvouched[rel] = (
            f"{escape_name(rel)}: modified since its download (its mtime is later than its "
            f"download metadata, and {why.split(': ', 1)[-1]})"
        )

    def problems(self) -> list[str]:
        """The refusal when some file is unvouched (and no manifest vouches instead): what, and the
        ways on."""
        if not self.unvouched:
            return []
        total = len(self.unvouched) + len(self.fresh)
        root = escape_name(self.root)
        head = (
            f"{root}: a huggingface_hub local-dir download without {MANIFEST_NAME}, but "
            f"{len(self.unvouched)} of its {total} file(s) have no download metadata that "
            "vouches for them, so nothing vouches for their bytes. Either write a manifest: "
            f"`python -m tpload manifest {root}` (hashes every tensor once; it vouches for the "
            "bytes as they are now), or load with --verify off (nothing is checked; every report "
            "says so), or download them again with `hf download ... --local-dir`. The files"
        )
        return [
            head + ":" + "".join(f"\n    - {self.unvouched[f]}" for f in sorted(self.unvouched))
        ]

    def source(self) -> FileSource:
        commits = sorted({m.commit for m in self.fresh.values()}) or ["none"]
        which = (
            f"commit {escape_name(commits[0][:12])}"
            if len(commits) == 1
            # one download, or several
            else f"{len(commits)} commits: {', '.join(escape_name(c[:12]) for c in commits)}"
        )
        return FileSource(
            kind=f"local-dir download ({which})",
            against="their local-dir etags",
            named_by="the etag its local-dir download metadata records",
            each="the etag its local-dir download metadata records",
            names="local-dir etags",
            vouched_by="the etag each file's local-dir download metadata records (files hashed "
            "whole)",
            locators_vouched_by="the sha256 taken of it while its file was hashed whole against "
            "its local-dir etag",
            metadata=self.root / DOWNLOAD_DIR,
        )

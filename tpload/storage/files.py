"""Opening and reading checkpoint files without trusting them.

Every file tpload reads (shard, index, manifest, export manifest) is opened by
:func:`open_regular`: with ``O_NONBLOCK``, so a FIFO or a device planted in its
place cannot block ``open()``, then checked with ``fstat`` on the descriptor
itself, so nothing can be swapped in between a check and the open. Symlinks
are followed (the Hugging Face cache links every file to a blob).

Bytes come in with ``pread`` into buffers the reader owns, never through a
shared map: a shard truncated while it is read gives a short read and a
message naming the file (a map would kill the process with SIGBUS), a shard
larger than memory costs nothing but the reads, and the bytes a rank checks
are the bytes it keeps (another process writing the file cannot change them
afterwards).

The path rules every writer shares live here too: which folder a checkpoint path names
(:func:`folder_of`) and whether a path to write lies inside it (:func:`report_in_checkpoint`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..model.errors import CheckpointError
from ..model.text import escape_name

if TYPE_CHECKING:  # an annotation only: the bounded reader imports no numpy (`--help` is cheap)
    import numpy as np

MAX_JSON_BYTES = 1 << 30  # an index or manifest larger than this is not a checkpoint's


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, refusing anything but a regular file (by name)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CheckpointError(f"{escape_name(path)}: cannot open {what} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
    except OSError as e:  # pragma: no cover - fstat on a fresh descriptor
        os.close(fd)
        raise CheckpointError(f"{escape_name(path)}: cannot stat {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )
        raise CheckpointError(
            f"{escape_name(path)}: {what} is {kind}; refused (only regular files are read)"
        )
    return fd


def _no_constants(token: str) -> object:
    raise ValueError(f"{token} is not a JSON number")


def read_json(path: Path, what: str, *, limit: int = MAX_JSON_BYTES) -> object:
    """A small JSON file (index, manifest), read whole from a regular file; CheckpointError saying
    what is wrong otherwise (NaN/Infinity, nesting too deep, numbers too long are refused)."""
    return parse_json(read_small(path, what, limit=limit), path, what)


def read_small(path: Path, what: str, *, limit: int = MAX_JSON_BYTES) -> bytes:
    """A whole small file (at most ``limit`` bytes, refused by its size before a byte is read),
    from a regular file only. Every file tpload reads whole comes through here (docs/threat-model.md
    lists them with their limits)."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise CheckpointError(
                f"{escape_name(path)}: {what} is {size} bytes, more than any {what} needs "
                f"(at most {limit}); refused"
            )
        return read_exact(fd, 0, size, path, what)
    finally:
        os.close(fd)


def parse_json(raw: bytes, path: Path, what: str) -> object:
    try:
        return json.loads(
            raw.decode("utf-8"), parse_constant=_no_constants
        )  # UTF-8 only, as safetensors reads it
    except RecursionError:
        raise CheckpointError(
            f"{escape_name(path)}: {what} is JSON nested too deeply; refused"
        ) from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, int digit limits, NaN/Infinity
        raise CheckpointError(
            f"{escape_name(path)}: {what} is not readable JSON ({escape_name(e)})"
        ) from None


def read_exact(fd: int, offset: int, n: int, path: Path, what: str) -> bytes:
    """``n`` bytes at ``offset``; CheckpointError naming the file if it ends early."""
    chunks, got = [], 0
    while got < n:
        try:
            b = os.pread(fd, n - got, offset + got)
        except OSError as e:
            raise CheckpointError(
                f"{escape_name(path)}: cannot read {what} ({e.strerror})"
            ) from None
        if not b:
            raise CheckpointError(
                f"{escape_name(path)}: {what} ends after {offset + got} bytes, "
                f"{n - got} short of what it promised"
            )
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


@dataclass(frozen=True)
class Stamp:
    """What a file looked like when it was opened: a later difference means it was rewritten.

    ctime too: a writer that puts the mtime back (``cp -p``, ``touch -r``) still moves it."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, fd: int) -> Stamp:
        st = os.fstat(fd)
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class Shard:
    """One open shard file: ``pread`` into caller buffers, with the file named in every error."""

    def __init__(self, path: Path, what: str = "shard") -> None:
        self.path = path
        self.fd = open_regular(path, what)
        self.opened = Stamp.of(self.fd)

    def read_into(self, offset: int, out: np.ndarray, *, tensor: str = "") -> None:
        """Fill ``out`` (a contiguous uint8 buffer) with the bytes at ``offset``."""
        view = memoryview(out).cast("B")
        done, n = 0, view.nbytes
        while done < n:
            try:
                got = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as e:
                where = f": tensor {escape_name(tensor)}" if tensor else ""
                hint = (
                    " (the file may have shrunk while it was read)" if e.errno == errno.EIO else ""
                )
                raise CheckpointError(
                    f"{escape_name(self.path)}{where}: read failed ({e.strerror}){hint}"
                ) from None
            if got == 0:
                where = f": tensor {escape_name(tensor)}" if tensor else ""
                raise CheckpointError(
                    f"{escape_name(self.path)}{where}: file ends at byte {offset + done}, "
                    f"{n - done} bytes short (truncated while it was read?)"
                )
            done += got

    def changed(self) -> str:
        """Why the file is not as it was when opened ("" when it is)."""
        try:
            now = Stamp.of(self.fd)
            named = os.stat(self.path)
        except OSError as e:
            return f"cannot stat it now ({e.strerror})"
        if (
            named.st_ino != self.opened.inode
        ):  # first: a replaced file's old inode changes too (its links)
            return "it was replaced by another file while it was loaded"
        if now != self.opened:
            return (
                f"it changed while it was loaded (size {self.opened.size} -> {now.size}, mtime "
                f"{self.opened.mtime_ns} -> {now.mtime_ns}, ctime {self.opened.ctime_ns} -> "
                f"{now.ctime_ns})"
            )
        return ""

    def advise(self, offset: int, length: int, advice: int) -> None:
        """posix_fadvise on this file (readahead, eviction); advice only: never fails a load."""
        if hasattr(os, "posix_fadvise"):
            try:  # noqa: SIM105  called per tensor: contextlib.suppress costs more a call
                os.posix_fadvise(self.fd, offset, length, advice)
            except OSError:
                pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file written whole or not at all: beside ``path`` first, renamed over it on success (a
    reader never sees half a file; a failure leaves the old one and no temporary)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """:func:`atomic_file` for data already in memory."""
    with atomic_file(path, mode=mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def folder_of(path: Path) -> Path:
    """The checkpoint folder a path names: the folder itself, or the folder holding a ``.gguf``
    file named instead (its manifest, hub snapshot or local-dir metadata vouch for the file; the
    file, or the split set it is part of, limits what is read there: storage/gguf.py's
    ``gguf_files``)."""
    return path.parent if path.name.endswith(".gguf") and path.is_file() else path


def report_in_checkpoint(report: str, checkpoint: str) -> str | None:
    """Why writing a report at ``report`` would write into the checkpoint folder ``checkpoint`` (a
    path inside it, spelled directly or through symlinks, or a file elsewhere that one of its
    entries is: a hub snapshot's blob, a hard link), or None. A ``.gguf`` file named as the
    checkpoint stands for its folder (its manifest, snapshot or download metadata are there)."""
    ckpt = folder_of(Path(checkpoint))
    if not ckpt.is_dir():
        return None  # no checkpoint there: the load says so
    try:
        folders = {Path(os.path.abspath(ckpt)), ckpt.resolve()}
        targets = {Path(os.path.abspath(report)), Path(report).resolve()}
    except (OSError, RuntimeError) as e:  # a symlink loop: refuse rather than guess where it points
        return f"cannot be resolved ({e})"
    for t in targets:
        for f in folders:
            if t.is_relative_to(f):
                return f"is inside the checkpoint {f}"
    try:
        st = os.stat(report)
    except OSError:
        return None  # a new file outside the folder
    with os.scandir(ckpt) as entries:
        for entry in entries:
            try:
                e = os.stat(entry.path)
            except OSError:
                continue
            if (e.st_dev, e.st_ino) == (st.st_dev, st.st_ino):
                return f"is the checkpoint's {entry.name} (the same file as {ckpt / entry.name})"
    return None


MAX_PEM_BYTES = 1 << 20
"""A key, a certificate or a certificate chain in PEM (a whole system CA bundle is about 300 KB)."""


def read_pem(path: str | os.PathLike, flag: str) -> bytes:
    """A PEM file named by an option (``--signer-key``, ``--attest-key``...), read whole by the
    bounded reader: a FIFO, a device or a file over :data:`MAX_PEM_BYTES` is refused naming it."""
    return read_small(Path(path), f"{flag} file", limit=MAX_PEM_BYTES)


MIN_SECRET_BYTES, MAX_SECRET_BYTES = 16, 4096
"""A shared secret (the refresh key): enough bytes to resist guessing, never a large file."""


def read_secret(path: str | os.PathLike, what: str) -> bytes:
    """A shared secret's file (the refresh key), read whole by the bounded reader: a regular file
    owned by this user that no one else may read or write (mode 0600 or stricter), of
    :data:`MIN_SECRET_BYTES` to :data:`MAX_SECRET_BYTES` bytes. Its bytes never reach a message."""
    p = Path(path)
    fd = open_regular(p, what)
    try:
        st = os.fstat(fd)
        problems = []
        if st.st_uid != os.geteuid():
            problems.append(f"is owned by uid {st.st_uid}, not this user ({os.geteuid()})")
        if st.st_mode & 0o077:
            problems.append(
                f"has mode {stat.S_IMODE(st.st_mode):04o}: others may read or write it "
                "(chmod 600 it)"
            )
        if not MIN_SECRET_BYTES <= st.st_size <= MAX_SECRET_BYTES:
            problems.append(
                f"is {st.st_size} bytes, expected {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} "
                "(make one with: (umask 077; head -c 32 /dev/urandom > FILE))"
            )
        if problems:
            raise CheckpointError(f"{escape_name(p)}: {what} {'; '.join(problems)}; refused")
        return read_exact(fd, 0, st.st_size, p, what)
    finally:
        os.close(fd)

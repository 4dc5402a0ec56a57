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
from typing import TYPE_CHECKING, BinaryIO, NoReturn

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import Json

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
        raise CheckpointError(
            f"{escape_name(path)}: {what} is {kind_of(st.st_mode)}; refused (only regular files "
            "are read)"
        )
    return fd


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a FIFO", "a device"...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _no_constants(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON number")


def read_json(path: Path, what: str, *, limit: int = MAX_JSON_BYTES) -> Json:
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


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """One JSON object, refused when a key appears twice: parsers disagree on which one counts
    (Python's keeps the last, others the first), so a document that says two things is not
    believed (a forged ``"predicate"`` before the honest one, a manifest entry given twice)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        # set.add's None (mypy: a None used) keeps the first-seen test in one pass
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return doc


def parse_json(raw: bytes, path: Path, what: str) -> Json:
    """Every trust-relevant JSON document tpload reads (the manifest, the index, config.json,
    hf_quant_config.json, an export's manifest, an attestation, the digest store's files, a
    signature bundle) is parsed here: UTF-8, no NaN or Infinity, no key twice in one object.
    Safetensors headers keep serde's own rules (storage/header_json.py)."""
    try:
        doc: Json = json.loads(
            raw.decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=_unique_keys
        )  # UTF-8 only, as safetensors reads it
        return doc
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
        view = out.data.cast("B")  # the array's own buffer
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


STDOUT = "-"
"""The path that names standard output (``--report -``): the one way tpload writes to a stream."""


def target_problem(path: str | os.PathLike[str]) -> str | None:
    """Why tpload will not write ``path`` (None: it may). Every file is written beside its path and
    renamed over it (:func:`atomic_file`), which replaces whatever the path is: so an existing path
    must be a regular file. A FIFO, a device, a socket or a folder is refused, and so is any
    symlink, whatever it points to: renaming over a link replaces the link, not its target
    (``/dev/stdout`` is one: renaming over it, as root, once replaced it with a file), and writing
    through it would give up the whole-or-nothing write. The words name ``--report -``, the way to
    get a report on standard output."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # a new file (its folder is the caller's to check)
    except OSError as e:
        return f"cannot be examined ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            mode = os.stat(path).st_mode
            to = "a regular file" if stat.S_ISREG(mode) else kind_of(mode)
        except OSError:
            to = "nothing (a broken link)"
        what = f"a symlink to {to}"
        name = "name the file itself" if to == "a regular file" else "name a regular file"
    else:
        what, name = kind_of(st.st_mode), "name a regular file"
    return (
        f"is {what}; tpload writes only regular files, whole (written beside and renamed into "
        f"place), never into a FIFO, a device or through a symlink: {name}, or use --report - for "
        "the JSON on standard output"
    )


class NotRegularTarget(OSError):
    """A path :func:`atomic_file` refuses (:func:`target_problem`): an OSError, so every writer's
    handling of a failed write (the report's warning, a command's one line) names it."""


@contextlib.contextmanager
def atomic_path(path: Path, *, mode: int = 0o644) -> Iterator[Path]:
    """A file written whole or not at all: the caller writes the temporary path this yields (beside
    ``path``), which is renamed over ``path`` on success (a reader never sees half a file; a failure
    leaves the old one and no temporary). Every file tpload writes comes through here (or
    :func:`atomic_file`, :func:`atomic_write` on top of it); a path that is not a regular file is
    refused (:func:`target_problem`) before anything is written."""
    why = target_problem(path)
    if why is not None:
        raise NotRegularTarget(errno.EEXIST, why, os.fspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """:func:`atomic_path`, open for writing."""
    with atomic_path(path, mode=mode) as tmp, os.fdopen(os.open(tmp, os.O_WRONLY), "wb") as f:
        yield f  # (the temporary mkstemp made, private to this process: no bounded read needed)


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
                other = os.stat(entry.path)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return f"is the checkpoint's {entry.name} (the same file as {ckpt / entry.name})"
    return None


MAX_PEM_BYTES = 1 << 20
"""A key, a certificate or a certificate chain in PEM (a whole system CA bundle is about 300 KB)."""


def read_pem(path: str | os.PathLike[str], flag: str) -> bytes:
    """A PEM file named by an option (``--signer-key``, ``--attest-key``...), read whole by the
    bounded reader: a FIFO, a device or a file over :data:`MAX_PEM_BYTES` is refused naming it."""
    return read_small(Path(path), f"{flag} file", limit=MAX_PEM_BYTES)


MIN_SECRET_BYTES, MAX_SECRET_BYTES = 16, 4096
"""A shared secret (the refresh key): enough bytes to resist guessing, never a large file."""


def read_secret(path: str | os.PathLike[str], what: str) -> bytes:
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

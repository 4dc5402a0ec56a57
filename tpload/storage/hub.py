"""A Hugging Face hub cache snapshot: every file is named by its own hash, so it can be verified.

The hub's download cache keeps ``models--ORG--NAME/blobs/HASH`` and links each file of a revision
from ``snapshots/REV/FILE`` to its blob. Large files are Git LFS objects and their blob name is
the sha256 of their bytes; small files (config.json, the index) are plain git objects, named by
their git blob SHA-1 (``sha1("blob <size>\\0" + bytes)``). A snapshot folder therefore carries
what a checkpoint without NATIVE_MANIFEST.json otherwise lacks: an expected digest per file.

That proves integrity against corruption (a bad disk, a torn download, a stray write), not against
someone who can write the cache: they can store any bytes under a matching name
(docs/threat-model.md). Whole files are hashed, so an expert-parallel layout hashes bytes no rank
of the node serves: the report gives the amplification, and ``tpload manifest`` (per tensor) avoids
it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import MANIFEST_NAME
from .files import atomic_write, read_small

SHA256_NAME = re.compile(r"[0-9a-f]{64}")
SHA1_NAME = re.compile(r"[0-9a-f]{40}")
LFS_SUFFIXES = (".safetensors", ".gguf")
"""The files the hub stores in Git LFS (its default ``.gitattributes``), named and etagged by their
sha256; the rest (the JSON files) are plain git objects."""


def upload_digest(path: Path) -> str:
    """What the hub names (and etags) ``path`` by once uploaded: the sha256 of an LFS file, the git
    blob SHA-1 of the rest (the writers of a hub cache and of a local-dir download, synth's)."""
    if path.suffix in LFS_SUFFIXES:
        return lfs_sha256(path)
    return git_blob_sha1(read_small(path, path.name))


@dataclass(frozen=True)
class Blob:
    """What a snapshot file's blob name promises about its bytes."""

    algorithm: str
    """``sha256`` (a Git LFS object) or ``git-sha1`` (a plain git object)."""
    digest: str


def git_blob_sha1(data: bytes) -> str:
    """Git's object name for a blob of these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_sha256(path: Path) -> str:
    """The sha256 an LFS object (a shard) is named and etagged by: of its bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(16 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_snapshot(root: Path) -> bool:
    """Whether ``root`` looks like ``.../snapshots/REV`` of a hub cache (a sibling ``blobs``
    folder)."""
    return root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir()


def blobs(root: Path, files: list[str]) -> dict[str, Blob]:
    """Each named file's :class:`Blob`, for a snapshot folder; CheckpointError for a file that is
    not a link to a hash-named blob of this cache (copied in by hand, or pointing elsewhere)."""
    store = (root.parent.parent / "blobs").resolve()
    out, problems = {}, []
    for name in files:
        link = root / name
        target = link.resolve()
        where = f"{escape_name(link)}"
        if not link.is_symlink() or target.parent != store:
            problems.append(
                f"{where}: not a link into {escape_name(store)} (a hub snapshot's files are links "
                "to blobs named by their hash; this one cannot be checked)"
            )
        elif SHA256_NAME.fullmatch(target.name):
            out[name] = Blob("sha256", target.name)
        elif SHA1_NAME.fullmatch(target.name):
            out[name] = Blob("git-sha1", target.name)
        else:
            problems.append(
                f"{where}: its blob {escape_name(target.name)} is not named by a sha256 or a git "
                "SHA-1"
            )
    if problems:
        raise CheckpointError(
            f"{len(problems)} file(s) of the hub snapshot {escape_name(root)} cannot be "
            "verified by their blob names:\n  - " + "\n  - ".join(problems)
        )
    return out


def read_checked(path: Path, blob: Blob, *, named: str = "its blob is named") -> bytes:
    """Read a small file (config.json, the index) whole and check it against its blob name (or its
    local-dir etag: ``named`` says which) now; the bytes checked."""
    data = read_small(path, "small file")
    got = git_blob_sha1(data) if blob.algorithm == "git-sha1" else hashlib.sha256(data).hexdigest()
    if got != blob.digest:
        raise CheckpointError(
            f"{escape_name(path)}: its bytes have {blob.algorithm} {got[:16]}..., but {named} "
            f"{blob.digest[:16]}...: the file is corrupt (re-download it)"
        )
    return data


def check_small(path: Path, blob: Blob, *, named: str = "its blob is named") -> str:
    """:func:`read_checked`, as the sha256 of the bytes checked."""
    return hashlib.sha256(read_checked(path, blob, named=named)).hexdigest()


def check_small_files(root: Path) -> dict[str, bytes]:
    """Check a snapshot's JSON files (config.json, the index, quantization files) by their blob
    names, before anything reads them: each one's bytes as checked (what the catalogue and the
    config's pick read, not the disk again)."""
    # a NATIVE_MANIFEST.json that `tpload manifest` wrote into the snapshot is the operator's own
    # file (a regular file, not a blob): the catalogue reads it as any manifest, and it outranks
    # blob names
    small = sorted(
        p.name
        for p in root.iterdir()
        if p.name.endswith(".json") and not (p.name == MANIFEST_NAME and not p.is_symlink())
    )
    named = blobs(root, small)
    return {name: read_checked(root / name, named[name]) for name in small}


def shard_digests(root: Path, shards: list[str]) -> dict[str, str]:
    """Each shard's expected sha256 (its LFS blob name). A shard stored as a plain git object (no
    LFS) is checked whole by its SHA-1 now, and expected to keep the sha256 of the bytes checked
    (the load hashes every shard again as it reads: a file changed since is caught there)."""
    named = blobs(root, list(shards))
    out = {}
    for shard in shards:
        b = named[shard]
        if b.algorithm == "sha256":
            out[shard] = b.digest
        else:
            out[shard] = check_small(
                root / shard, b
            )  # a tiny shard committed without LFS: whole, now
    return out


def to_hub_cache(src: Path, cache: Path, repo: str, revision: str = "main") -> Path:
    """Move a checkpoint folder's files into a hub cache layout (what ``huggingface_hub`` downloads
    make): ``cache/models--ORG--NAME/{blobs,snapshots/REV,refs/main}``; return the snapshot folder.
    ``*.safetensors`` and ``*.gguf`` become LFS blobs (sha256 names), everything else git blobs
    (SHA-1 names)."""
    top = cache / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
    store, snap = top / "blobs", top / "snapshots" / rev
    store.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        digest = upload_digest(f)
        os.replace(f, store / digest)
        (snap / f.name).symlink_to(os.path.relpath(store / digest, snap))
    (top / "refs").mkdir(exist_ok=True)
    atomic_write(top / "refs" / "main", rev)
    return snap

"""The JSON files that shape a plan, pinned by the manifest.

``config.json`` (head counts, the architecture), ``hf_quant_config.json`` (the codec family) and
the index (which shard holds which tensor) decide what every rank serves as much as the shards do,
so ``tpload manifest`` records the sha256 of each one present beside the tensors' digests:

    {"format": 1, "files": {"config.json": {"sha256": "..."}, ...}, "tensors": {...}}

Every reader of those files goes through :meth:`Pins.read`, which checks the bytes it returns
against the manifest: a pinned file that changed, vanished, or appeared after the manifest was
written is refused by name before a byte of it is believed. A manifest written before pins existed
has no ``"files"``: its JSON files are read unchecked, and the load says so in a note.

A GGUF file has no config.json: its header's key-values (the architecture, head and expert
counts, rope settings, the tokenizer) say what config.json would. The manifest pins them the same
way, one sha256 per GGUF file of the bytes from the file's start through its last key-value pair
(the magic, version, counts and every pair, exactly as stored):

    {"format": 1, "files": {}, "gguf_kv": {"model-00001-of-00002.gguf": {"sha256": "..."}}, ...}

Those raw bytes, not a canonical encoding of the parsed pairs: the reader keeps a long array (the
tokenizer's 150,000 tokens) only as its length, so an encoding of what it parsed would leave the
tokenizer out; the bytes cover every pair whatever the reader keeps, and need no second encoder to
agree with llama.cpp's. The catalogue checks them as it reads the headers, before the config is
picked; a manifest without ``"gguf_kv"`` (written before tpload pinned them) loads with a note.

Pins are looked up by the sha256 of the manifest's bytes (read again at each use), so a reader
never believes pins of another manifest than the one on disk, and a manifest parsed once by the
catalogue is not parsed again for its pins.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import CheckpointError, raise_all
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME, Json
from .files import parse_json, read_small

PLAN_FILES = ("config.json", "hf_quant_config.json", INDEX_NAME)
"""The JSON files that shape a plan, in the order they are checked."""
WHAT = {
    "config.json": "model config",
    "hf_quant_config.json": "ModelOpt quantization config",
    INDEX_NAME: "index",
}


def renew(what: str, target: str = "DIR") -> str:
    """How to pin ``what`` again, and what that costs (one wording everywhere; ``target``: what to
    give ``tpload manifest``, the folder or a GGUF set's first file)."""
    return (
        f"`python -m tpload manifest {target} --force` pins {what}, which changes the manifest's "
        "sha256: --manifest-sha256 pins and stored predictions (`plan --write`, `manifest --hash "
        "blake3`) made from the old manifest must then be renewed"
    )


_HEX64 = re.compile(r"[0-9a-f]{64}")


def file_sha256(path: Path, what: str) -> str:
    return hashlib.sha256(read_small(path, what)).hexdigest()


def pins_to_write(root: Path, *, known: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The manifest's ``"files"`` for ``root``: the sha256 of each plan-shaping JSON file present
    (``known``: digests of bytes already read and used, which win over reading the file again)."""
    known = known or {}
    return {
        name: {"sha256": known.get(name) or file_sha256(root / name, name)}
        for name in PLAN_FILES
        if name in known or os.path.lexists(root / name)
    }


GGUF_KV = "gguf_kv"
"""The manifest's key for the GGUF files' key-value pins."""


def plan_file_digests(
    root: Path, *, known: dict[str, str] | None = None, gguf_kv: dict[str, tuple[str, int]]
) -> dict[str, str]:
    """The sha256 of every file that shapes the plan as this rank holds it, pinned or not, for the
    handshake (every rank must hold the same): each of :data:`PLAN_FILES` ("" where absent;
    ``known``: digests of the bytes already read and used (:attr:`Pins.seen`, the catalogue's
    index), which win over reading again: a file nothing read is read now), and under
    :data:`GGUF_KV` one sha256 over a GGUF set's key-value pins by file (``gguf_kv``: the
    catalogue's {file: (sha256, length)}; "" for no GGUF set)."""
    known = known or {}
    out = {
        name: known.get(name)
        or (file_sha256(root / name, WHAT[name]) if os.path.lexists(root / name) else "")
        for name in PLAN_FILES
    }
    lines = "".join(f"{f}\t{sha}\n" for f, (sha, _) in sorted(gguf_kv.items()))
    out[GGUF_KV] = hashlib.sha256(lines.encode()).hexdigest() if gguf_kv else ""
    return out


def pins_doc(
    root: Path, *, known: dict[str, str] | None = None, gguf_kv: dict[str, str] | None = None
) -> dict[str, object]:
    """What a manifest tpload writes pins, beside its ``"tensors"``: ``"files"`` (the plan-shaping
    JSON files present, :func:`pins_to_write`) and, for a GGUF set, ``"gguf_kv"`` ({file: the
    sha256 of its key-value section as the catalogue read it})."""
    doc: dict[str, object] = {"files": pins_to_write(root, known=known)}
    if gguf_kv:
        doc[GGUF_KV] = {f: {"sha256": sha} for f, sha in sorted(gguf_kv.items())}
    return doc


def parse_pins(doc: Json, path: Path) -> tuple[dict[str, str] | None, bool, dict[str, str] | None]:
    """A parsed manifest's pins ({file name: sha256}; None when it has no ``"files"``), whether it
    is an export's, and its GGUF key-value pins ({GGUF file: sha256}; None when it has no
    ``"gguf_kv"``). Names tpload does not pin are ignored (a later tpload may pin more)."""
    if not isinstance(doc, dict):
        return None, False, None
    export = "partitioned" in doc
    files = _sha_map(doc.get("files"), path, "files", "pinned JSON file")
    kv = _sha_map(doc.get(GGUF_KV), path, GGUF_KV, "GGUF file")
    if files is not None:
        files = {n: sha for n, sha in files.items() if n in PLAN_FILES}
    return files, export, kv


def _sha_map(value: Json, path: Path, key: str, what: str) -> dict[str, str] | None:
    """``{name: {"sha256": 64 hex digits}}`` as {name: sha256}; None when absent."""
    if value is None:
        return None
    bad = f'{escape_name(path)}: "{key}" must map each {what} to {{"sha256": 64 hex digits}}'
    if not isinstance(value, dict):
        raise CheckpointError(bad)
    out = {}
    for name, entry in value.items():
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha.lower()):
            raise CheckpointError(f"{bad}; the entry for {escape_name(name)} is not")
        out[name] = sha.lower()
    return out


@dataclass(frozen=True)
class Pins:
    """What the manifest on disk pins about a checkpoint folder's JSON files."""

    root: Path
    manifest_sha256: str | None
    """The sha256 of the manifest's bytes the pins come from (None: the folder has no manifest)."""
    files: dict[str, str] | None
    """{pinned file: sha256}; None when the manifest pins nothing (no manifest, or written before
    pins)."""
    export: bool = False
    gguf_kv: dict[str, str] | None = None
    """{GGUF file: sha256 of its key-value section}; None when the manifest pins none (no manifest,
    or written before tpload pinned them)."""
    seen: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """{file: the sha256 of the bytes :meth:`read` returned}: what shaped the plan, as read (the
    handshake compares it: :func:`plan_file_digests`)."""
    given: Mapping[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    """Files a vouching step already read whole and checked (a hub snapshot's by their blob names,
    a local-dir download's by their etags): read from these bytes, not from the disk again, so the
    bytes that shape the plan are the bytes that were checked."""
    _read: dict[str, bytes | None] = field(default_factory=dict, compare=False, repr=False)
    """What :meth:`read` returned for each file, checked: a load reads each once (the catalogue,
    the pins' check, the config's pick and the planner all ask), so what shaped one step shapes
    the next, and a file changed between them cannot split the plan."""

    @classmethod
    def of(cls, root: Path) -> Pins:
        """The pins of the manifest in ``root`` as it is now (read and parsed whole: a load passes
        the pins its catalogue parsed instead)."""
        path = root / MANIFEST_NAME
        if not os.path.lexists(path):
            return cls(root, None, None)
        raw = read_small(path, "manifest")
        sha = hashlib.sha256(raw).hexdigest()
        return cls(root, sha, *parse_pins(parse_json(raw, path, "manifest"), path))

    def read(self, name: str, what: str) -> bytes | None:
        """The bytes of ``root/name`` (None when it is absent and may be), checked against the
        pin; read from disk once, then handed on."""
        if name not in self._read:
            self._read[name] = self._read_now(name, what)
        return self._read[name]

    def _read_now(self, name: str, what: str) -> bytes | None:
        path = self.root / name
        given = self.given.get(name)
        present = given is not None or os.path.lexists(path)
        if self.files is None:
            if not present:
                return None
            data = given if given is not None else read_small(path, what)
            self.seen[name] = hashlib.sha256(data).hexdigest()
            return data
        want = self.files.get(name)
        manifest = escape_name(self.root / MANIFEST_NAME)
        if want is None:
            if present:
                raise CheckpointError(
                    f"{escape_name(path)}: {what} is not pinned by {manifest} (added after the "
                    f"manifest was written?); refused: it shapes what every rank serves. If it "
                    f"belongs there, {renew('it')}"
                )
            return None
        if not present:
            raise CheckpointError(
                f"{escape_name(path)}: {what} is missing, but {manifest} pins its sha256 "
                f"{want[:16]}...; restore it"
            )
        data = given if given is not None else read_small(path, what)
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise CheckpointError(
                f"{escape_name(path)}: {what} has sha256 {got[:16]}..., but {manifest} pins "
                f"{want[:16]}...: it changed after the manifest was written; restore it, or if the "
                f"change is meant, {renew('it again')}"
            )
        self.seen[name] = got
        return data

    def problems(self) -> list[str]:
        """Each plan-shaping file that does not match its pin (every one checked)."""
        out = []
        for name in PLAN_FILES:
            try:
                self.read(name, WHAT[name])
            except CheckpointError as e:
                out.append(str(e))
        return out

    def gguf_problems(self, kv: dict[str, tuple[str, int]]) -> list[str]:
        """Each GGUF file whose key-value section (``kv``: {file: (its sha256, its length in bytes)}
        as read) the manifest does not pin as it is now; none when the manifest pins no key-values
        (no manifest, or an older one: :func:`check_plan_files` notes that)."""
        if self.manifest_sha256 is None or self.gguf_kv is None:
            return []
        manifest = escape_name(self.root / MANIFEST_NAME)
        first = escape_name(self.root / next(iter(kv), ""))  # what names the set to `manifest`
        out = []
        for file, (got, size) in kv.items():
            want = self.gguf_kv.get(file)
            where = f"{escape_name(self.root / file)}: GGUF key-values (its first {size} bytes)"
            if want is None:
                names = sorted(self.gguf_kv)
                pinned = ", ".join(escape_name(f) for f in names[:3]) or "none"
                pinned += f" (and {len(names) - 3} more)" if len(names) > 3 else ""
                out.append(
                    f"{where} are not pinned by {manifest}, which pins those of {pinned} (a "
                    "manifest written for another GGUF file of this folder?); refused: they say "
                    f"what the model is. If this file belongs there, {renew('it', first)}"
                )
            elif got != want:
                out.append(
                    f"{where} have sha256 {got[:16]}..., but {manifest} pins {want[:16]}...: the "
                    "header (head or expert counts, rope settings, the tokenizer) changed after "
                    f"the manifest was written; restore the file, or if the change is meant, "
                    f"{renew('them again', first)}"
                )
        return out


def check_plan_files(
    root: Path,
    manifest_sha256: str | None,
    pins: Pins | None = None,
    *,
    gguf: list[str] | None = None,
) -> list[str]:
    """Check every plan-shaping JSON file of ``root`` against the manifest that was opened (its
    bytes' sha256; ``pins``: those parsed from its very bytes, else read from disk now and required
    to be the same manifest); raise CheckpointError listing each mismatch. Returns notes: a manifest
    that pins nothing while such files are present, or (``gguf``: the GGUF files read, whose
    key-values the catalogue checked against the pins as it read them) no GGUF key-values."""
    pins = pins or Pins.of(root)
    if manifest_sha256 is not None and pins.manifest_sha256 != manifest_sha256:
        raise CheckpointError(
            f"{escape_name(root / MANIFEST_NAME)}: changed since the checkpoint was opened "
            f"(sha256 {manifest_sha256[:16]}... then, {(pins.manifest_sha256 or 'none')[:16]}... "
            "now); nothing read under the old one is trusted"
        )
    if pins.manifest_sha256 is None:
        # nothing vouches for the folder: the load says so itself (or a hub snapshot's blob names
        # do)
        return []
    notes = []
    if gguf and pins.gguf_kv is None and not pins.export:
        notes.append(
            f"{MANIFEST_NAME} pins no GGUF key-values of {', '.join(gguf)} (written before tpload "
            "pinned GGUF headers), so an edit to them (head or expert counts, rope settings, the "
            f"tokenizer) would change the model unnoticed; {renew('them')}"
        )
    if pins.files is None:
        present = [n for n in PLAN_FILES if os.path.lexists(root / n)]
        if not present or pins.export:
            return notes
        note = (
            f"{MANIFEST_NAME} pins none of {', '.join(present)} (written before tpload pinned the "
            "JSON files that shape a plan), so an edit to them would change what is served "
            f"unnoticed; {renew('them')}"
        )
        return [note, *notes]
    raise_all(
        CheckpointError,
        pins.problems(),
        what="JSON files that do not match their pins in the manifest",
    )
    return notes

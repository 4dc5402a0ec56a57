"""The JSON files that shape a plan, pinned by the manifest.

``config.json`` (head counts, the architecture), ``hf_quant_config.json`` (the codec family) and
the index (which shard holds which tensor) decide what every rank serves as much as the shards do,
so ``tpload manifest`` records the sha256 of each one present beside the tensors' digests:

    {"format": 1, "files": {"config.json": {"sha256": "..."}, ...}, "tensors": {...}}

Every reader of those files goes through :meth:`Pins.read`, which checks the bytes it returns
against the manifest: a pinned file that changed, vanished, or appeared after the manifest was
written is refused by name before a byte of it is believed. A manifest written before pins existed
has no ``"files"``: its JSON files are read unchecked, and the load says so in a note.

Pins are looked up by the sha256 of the manifest's bytes (read again at each use), so a reader
never believes pins of another manifest than the one on disk, and a manifest parsed once by the
catalogue is not parsed again for its pins.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, raise_all
from ..text import escape_name
from .files import parse_json, read_small

INDEX_NAME = "model.safetensors.index.json"
MANIFEST_NAME = "NATIVE_MANIFEST.json"
PLAN_FILES = ("config.json", "hf_quant_config.json", INDEX_NAME)
"""The JSON files that shape a plan, in the order they are checked."""
WHAT = {
    "config.json": "model config",
    "hf_quant_config.json": "ModelOpt quantization config",
    INDEX_NAME: "index",
}


def renew(what: str) -> str:
    """How to pin ``what`` again, and what that costs (one wording everywhere)."""
    return (
        f"`python -m tpload manifest DIR --force` pins {what}, which changes the manifest's "
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


def parse_pins(doc: object, path: Path) -> tuple[dict[str, str] | None, bool]:
    """A parsed manifest's pins ({file name: sha256}; None when it has no ``"files"``) and whether
    it is an export's. Names tpload does not pin are ignored (a later tpload may pin more)."""
    if not isinstance(doc, dict):
        return None, False
    export = "partitioned" in doc
    files = doc.get("files")
    if files is None:
        return None, export
    bad = (
        f'{escape_name(path)}: "files" must map each pinned JSON file to {{"sha256": 64 hex '
        "digits}"
    )
    if not isinstance(files, dict):
        raise CheckpointError(bad)
    out = {}
    for name, entry in files.items():
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha.lower()):
            raise CheckpointError(f"{bad}; the entry for {escape_name(name)} is not")
        if name in PLAN_FILES:
            out[name] = sha.lower()
    return out, export


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
        pin."""
        path = self.root / name
        present = os.path.lexists(path)
        if self.files is None:
            return read_small(path, what) if present else None
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
        data = read_small(path, what)
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise CheckpointError(
                f"{escape_name(path)}: {what} has sha256 {got[:16]}..., but {manifest} pins "
                f"{want[:16]}...: it changed after the manifest was written; restore it, or if the "
                f"change is meant, {renew('it again')}"
            )
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


def check_plan_files(
    root: Path, manifest_sha256: str | None, pins: Pins | None = None
) -> list[str]:
    """Check every plan-shaping JSON file of ``root`` against the manifest that was opened (its
    bytes' sha256; ``pins``: those parsed from its very bytes, else read from disk now and required
    to be the same manifest); raise CheckpointError listing each mismatch. Returns notes: a manifest
    that pins nothing while such files are present."""
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
    if pins.files is None:
        present = [n for n in PLAN_FILES if os.path.lexists(root / n)]
        if not present or pins.export:
            return []
        note = (
            f"{MANIFEST_NAME} pins none of {', '.join(present)} (written before tpload pinned the "
            "JSON files that shape a plan), so an edit to them would change what is served "
            f"unnoticed; {renew('them')}"
        )
        return [note]
    raise_all(
        CheckpointError,
        pins.problems(),
        what="JSON files that do not match their pins in the manifest",
    )
    return []

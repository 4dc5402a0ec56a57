"""The version manifest: what a round carries, sent by the trainer's rank 0 to every engine rank
before any window, as canonical bytes (sorted-key compact JSON: the same statement is the same
bytes), optionally signed with the attestation's key format (an EC private key in PEM; the engine
holds the public key).

It names the version (an integer, strictly newer than the one served), the engine layout it was
planned for, the strength of check, the whole tensor table (names, dtypes, shapes: the engine
refuses a table that is not the one it serves), and per engine rank its digest (what a fresh
``tpload.load`` of a checkpoint of these weights gives that rank) and its windows, in the plan's
order: each one's tensor, box, sending trainer rank, fingerprint and, at sha256 strength, its
sha256. A rank's digest is a hash of checksums (docs/format.md): the fingerprints stop transport
faults, only the signed sha256s stop a forger (docs/threat-model.md, "Refresh").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..model.pushed import TensorEntry, WindowEntry
from ..model.text import escape_name
from ..model.values import Json
from ..storage.files import read_pem
from .layout import EngineLayout
from .terms import RefreshCheck, RefreshError, version_problem

FORMAT = 1
MAX_NAME = 4096


@dataclass(frozen=True)
class RankEntry:
    """One engine rank's part of the round."""

    digest: str
    windows: tuple[WindowEntry, ...]

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.windows)


@dataclass(frozen=True)
class VersionManifest:
    """The round's statement (see the module doc)."""

    version: int
    layout: EngineLayout
    check: RefreshCheck
    tensors: tuple[TensorEntry, ...]
    """Every tensor of the version, in natural order."""
    ranks: tuple[RankEntry, ...]
    """Per engine rank (index = engine rank)."""
    trainer_ranks: int
    chunk_bytes: int
    """The largest message a window is sent in (every side cuts the same chunks)."""

    def to_bytes(self) -> bytes:
        """The canonical bytes: what is signed, sent and compared."""
        doc = {
            "format": FORMAT,
            "version": self.version,
            "layout": json.loads(self.layout.to_bytes()),
            "check": str(self.check),
            "trainer_ranks": self.trainer_ranks,
            "chunk_bytes": self.chunk_bytes,
            "tensors": [[t.name, t.dtype, list(t.shape)] for t in self.tensors],
            "ranks": [
                {
                    "digest": r.digest,
                    "windows": [
                        [
                            w.name,
                            list(w.view),
                            [list(w.box[0]), list(w.box[1])],
                            w.trainer,
                            list(w.fingerprint),
                            w.sha256,
                        ]
                        for w in r.windows
                    ],
                }
                for r in self.ranks
            ],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    def sign(self, key: str | Path) -> bytes:
        """An ECDSA (SHA-256) signature of :meth:`to_bytes` with the PEM private key ``key`` (the
        attestation's key format)."""
        return sign_bytes(self.to_bytes(), key)

    @classmethod
    def from_bytes(
        cls,
        raw: bytes,
        *,
        signature: bytes | None = None,
        public_key: str | Path | None = None,
    ) -> VersionManifest:
        """The manifest in ``raw``, refused (:class:`RefreshError`) when it does not parse, is not
        canonical, or, with ``public_key``, when ``signature`` is missing or does not verify."""
        if public_key is not None:
            problem = signature_problem(raw, signature, public_key)
            if problem:
                raise RefreshError(problem)
        try:
            doc = json.loads(raw)
            manifest = _parse(doc)
        except (ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError) as e:
            if isinstance(e, RefreshError):
                raise
            raise RefreshError(
                f"the version manifest is malformed ({type(e).__name__}: "
                f"{escape_name(str(e))[:200]})"
            ) from None
        if manifest.to_bytes() != raw:  # one statement, one encoding: nothing rides beside it
            raise RefreshError(
                f"version {manifest.version}: the manifest's bytes are not its canonical encoding"
            )
        return manifest


def _ints(v: Json, n: int) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) != n or not all(type(x) is int for x in v):
        raise ValueError(f"expected {n} integers, got {escape_name(repr(v))[:80]}")
    return tuple(v)


def _pair(v: Json) -> tuple[int, int]:
    a, b = _ints(v, 2)
    return a, b


def _triple(v: Json) -> tuple[int, int, int]:
    a, b, c = _ints(v, 3)
    return a, b, c


def _str(v: Json, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
        raise ValueError(f"{what} is not a name")
    return v


def _parse(doc: Json) -> VersionManifest:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a version manifest of format {FORMAT}")
    version, trainers, chunk = doc["version"], doc["trainer_ranks"], doc["chunk_bytes"]
    if not all(type(v) is int and v >= 0 for v in (version, trainers, chunk)) or not chunk:
        raise ValueError("version, trainer_ranks and chunk_bytes must be integers")
    if version_problem(version):
        raise ValueError(version_problem(version))
    layout = EngineLayout.from_bytes(json.dumps(doc["layout"]).encode())
    check = RefreshCheck(doc["check"])
    tensors = tuple(
        TensorEntry(_str(t[0], "a tensor"), _str(t[1], "a dtype"), _ints(t[2], len(t[2])))
        for t in doc["tensors"]
    )
    ranks = []
    for r in doc["ranks"]:
        windows = []
        for w in r["windows"]:
            sha = w[5]
            if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
                raise ValueError("a window's sha256 is not 64 hex digits")
            view = _pair(w[1])
            box = (_pair(w[2][0]), _pair(w[2][1]))
            (r0, r1), (c0, c1) = box
            if not (0 <= r0 <= r1 <= view[0] and 0 <= c0 <= c1 <= view[1]):
                raise ValueError(f"window {escape_name(w[0])}: its box is outside its view")
            trainer = w[3]
            if type(trainer) is not int or not 0 <= trainer < trainers:
                raise ValueError(f"window {escape_name(w[0])}: no trainer rank {trainer!r}")
            windows.append(
                WindowEntry(_str(w[0], "a window"), view, box, trainer, _triple(w[4]), sha)
            )
        digest = r["digest"]
        if not (isinstance(digest, str) and len(digest) == 64):
            raise ValueError("a rank's digest is not 64 hex digits")
        ranks.append(RankEntry(digest, tuple(windows)))
    if len(ranks) != layout.ranks:
        raise ValueError(f"{len(ranks)} rank entries for {layout.ranks} engine ranks")
    return VersionManifest(version, layout, check, tensors, tuple(ranks), trainers, chunk)


def sign_bytes(data: bytes, key: str | Path) -> bytes:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = read_pem(key, "signer_key")
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise RefreshError(f"{escape_name(key)}: not a PEM private key ({e})") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise RefreshError(f"{escape_name(key)}: not an EC private key (the attestation's format)")
    return bytes(private.sign(data, ec.ECDSA(hashes.SHA256())))


def signature_problem(data: bytes, signature: bytes | None, key: str | Path) -> str:
    """'' when ``signature`` is an ECDSA (SHA-256) signature of ``data`` by the PEM public key
    ``key``; else one line saying why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = read_pem(key, "public_key")
    try:
        public = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        return f"{escape_name(key)}: not a PEM public key ({e})"
    if not isinstance(public, ec.EllipticCurvePublicKey):
        return f"{escape_name(key)}: not an EC public key (the attestation's format)"
    if not signature:
        return (
            f"the version manifest is not signed, and this engine takes only manifests signed "
            f"by {escape_name(key)}"
        )
    try:
        public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return (
            f"the version manifest's signature does not verify with {escape_name(key)} (signed by "
            "another key, or the manifest was changed on the wire)"
        )
    return ""


def natural_tensors(entries: Sequence[TensorEntry]) -> tuple[TensorEntry, ...]:
    from ..model.templates import natural_key

    return tuple(sorted(entries, key=lambda t: natural_key(t.name)))

"""The trust source a load's served bytes were checked against, as a record: what the gate's
strategy used (``Strategy.trust``), carried by the verdict into the report's ``verified:`` line,
the JSON report's ``trust`` and the attestation's ``checkpoint.trust``.

One record for every anchor, so what vouched is said the same way wherever it is said: its kind,
the file (or folder) it lives in, the sha256 of that file's bytes where the load read them whole,
and, for a signature, who signed as the bundle proves it. The gate makes it, the report and the
attestation print it: a value they share, so it stands on the data floor."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from .text import escape_name


class TrustKind(StrEnum):
    """What vouched for the served bytes."""

    NONE = "none"
    """``--verify off``: nothing."""
    MANIFEST = "manifest"
    """NATIVE_MANIFEST.json's per-tensor digests (an export's manifest for its rank files)."""
    SIGNATURE = "signature"
    """A model-signing bundle (model.sig): its file digests, or the manifest it signs."""
    HUB_SNAPSHOT = "hub-snapshot"
    """A hub cache snapshot's blob names (each file's sha256)."""
    LOCAL_DIR = "local-dir"
    """A local-dir download's metadata (each file's etag)."""
    PREDICTION = "stored-prediction"
    """``--verify digest``: the operator's stored prediction of every rank's digest."""


@dataclass(frozen=True)
class TrustSource:
    """One trust source, as the report and the attestation record it."""

    kind: TrustKind
    file: str | None = None
    """The anchor's file (the manifest, the bundle, the digest store's file) or folder (the
    snapshot, the local-dir metadata)."""
    sha256: str | None = None
    """The sha256 of :attr:`file`'s bytes as the load read them (manifest, bundle)."""
    signer: str | None = None
    """A signature's signer, as the bundle proves it (signing.SignedModel.signer_id)."""
    manifest: str | None = None
    """The manifest the anchor vouches through (a signed manifest; the manifest a stored
    prediction was verified against)."""
    manifest_sha256: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {k: (str(v) if v is not None else None) for k, v in asdict(self).items()}

    def words(self, root: str | os.PathLike[str] | None = None) -> str:
        """The source in one phrase, files named relative to the checkpoint ``root`` when inside it
        (the ``verified:`` line: "... against {words}")."""

        def name(path: str | None) -> str:
            if path is None:
                return "?"
            if root is not None:
                try:
                    return escape_name(Path(path).relative_to(Path(root).absolute()).as_posix())
                except ValueError:
                    pass
            return escape_name(path)

        def sha(digest: str | None) -> str:
            return f"sha256 {digest[:16]}..." if digest else "sha256 ?"

        through = (
            f"; it signs {name(self.manifest)} ({sha(self.manifest_sha256)})"
            if self.manifest
            else ""
        )
        match self.kind:
            case TrustKind.NONE:
                return "nothing (--verify off)"
            case TrustKind.MANIFEST:
                return f"{name(self.file)} ({sha(self.sha256)})"
            case TrustKind.SIGNATURE:
                return f"{name(self.file)} ({sha(self.sha256)}, signer {self.signer}{through})"
            case TrustKind.HUB_SNAPSHOT:
                return f"the blob names of hub snapshot {escape_name(self.file)}"
            case TrustKind.LOCAL_DIR:
                return f"the local-dir etags in {name(self.file)}"
            case TrustKind.PREDICTION:
                return (
                    f"the prediction stored in {escape_name(self.file)} (verified against "
                    f"{name(self.manifest)}, {sha(self.manifest_sha256)})"
                )
        return str(self.kind)  # pragma: no cover - every kind is matched above


UNCHECKED = TrustSource(TrustKind.NONE)

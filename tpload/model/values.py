"""The value types several layers exchange, and the names they share.

Small immutable things: a fingerprint's triple, a window's box, where stored bytes are, the sizes
of the node cross-check's values, the file names a checkpoint's anchors have, the layout. Nothing
here reads a file or imports anything of tpload but its errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

from .errors import LayoutError

MAX_WORLD = 1 << 16  # no layout has more ranks than this; bigger numbers are typos, not plans

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object: a parsed one, or one built to be written or sent as JSON (a report's rows, an
engine's extra config, a request's body). Its values are unchecked, as :data:`Json`'s."""

Json: TypeAlias = JsonObject | list[Any] | str | int | float | bool | None
"""A parsed JSON document (or one of its values), not yet checked: what the bounded reader and the
header parser hand back (storage/files.py, storage/header_json.py). An object's values and a list's
items are unchecked too, until their own isinstance."""

Triple = tuple[int, int, int]
"""A fingerprint: (total, rows, cols), int64 sums of a window's words (kernels/fingerprint.py)."""


Box = tuple[tuple[int, int], tuple[int, int]]
"""A window of a stored tensor: (rows, byte columns) of its 2-D view."""


class Stored(NamedTuple):
    """Stored bytes a rank reads: a whole tensor of a shard, or one window in a rank file.

    A named tuple, made when asked for and dropped after (a tuple is made in C; a load of 92,000
    tensors keeps none of them to the end, so the collector has none to walk)."""

    name: str
    """The official tensor name."""
    path: Path
    """The file that holds them."""
    offset: int
    """Absolute offset of their first byte in that file."""
    rows: int
    """Rows of their 2-D byte view (a 0-D or 1-D tensor is one row)."""
    row_bytes: int
    sha256: str | None
    """What the manifest promises for exactly these bytes (None: no manifest entry)."""

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def seen_as(self, view: tuple[int, int]) -> Stored:
        """The same bytes as ``view`` rows of ``view`` bytes (any split of them)."""
        if view == (self.rows, self.row_bytes):
            return self
        if view[0] * view[1] != self.nbytes:
            raise ValueError(f"{self.name}: {self.nbytes} bytes cannot be seen as {list(view)}")
        return self._replace(rows=view[0], row_bytes=view[1])


DIGEST_BYTES = 32
"""Bytes of a folded value in the exchange's row (the node cross-check's, the replicas')."""
SLOTS = 8
"""Values per row: one per node peer (by position on the node); on a node of more ranks, peers
share slots, their values folded by XOR (still compared, no longer told apart)."""
AGREED_BYTES = 240
"""The terms' hashes as hex in the exchange's row (``RankFigures.agreed``): 16 hex digits (one
64-bit hash) for each of the fifteen terms every rank must agree on (verification/terms.py's
``FIELDS``; tests/unit/verification/test_gate.py holds the two together)."""

INDEX_NAME = "model.safetensors.index.json"
MANIFEST_NAME = "NATIVE_MANIFEST.json"
"""The manifest: every tensor's file, dtype, shape and sha256 (docs/format.md)."""

SIGNER_FIELDS = (
    "signature",
    "signer_key",
    "signer_cert",
    "signer_chain",
    "signer_identity",
    "signer_issuer",
)
"""The options that say which bundle and which signer: the load's, and ``verify``, ``manifest`` and
``attest verify``'s (verification/signing.py checks them)."""


@dataclass(frozen=True)
class FileSource:
    """Where a folder's whole-file digests come from, in words: what the gate's note, verdict and
    messages say (whole_files.FileDigests, offline.py)."""

    kind: str
    """What the folder is (the note's first words)."""
    against: str
    """"N file(s) checked whole against {against}"."""
    named_by: str
    """What a file's expected sha256 is, in a mismatch."""
    each: str
    """"by sha256 against {each}" (``tpload verify``'s summary)."""
    names: str
    """The digests, plural (``tpload manifest``'s refusal)."""
    vouched_by: str
    locators_vouched_by: str
    metadata: Path | None = None
    """The folder of download metadata that records the digests (a local-dir download's); None:
    the files' own names are the digests (a hub snapshot's blobs)."""


@dataclass(frozen=True)
class Layout:
    """How the ranks of one group split a checkpoint: ``tp`` x ``ep``."""

    tp: int
    """Tensor-parallel degree: ranks that share every matrix, each a window."""
    ep: int = 1
    """Expert-parallel degree: groups of ``tp`` ranks that split the experts."""

    def __post_init__(self) -> None:
        if not (
            1 <= self.tp <= MAX_WORLD
            and 1 <= self.ep <= MAX_WORLD
            and self.tp * self.ep <= MAX_WORLD
        ):
            raise LayoutError(
                f"tp {self.tp} x ep {self.ep}: each must be >= 1 and their product at most "
                f"{MAX_WORLD}"
            )

    @property
    def world(self) -> int:
        return self.tp * self.ep

    def position(self, rank: int) -> tuple[int, int]:
        """(expert-parallel group, tensor-parallel rank) of a group rank: tp is innermost."""
        return divmod(rank, self.tp)


SNAPSHOT = FileSource(
    kind="hub cache snapshot",
    against="their blob sha256",
    named_by="the hash its hub blob is named by",
    each="the hub blob it is named by",
    names="hub blob names",
    vouched_by="the sha256 each hub blob is named by (files hashed whole)",
    locators_vouched_by="the sha256 taken of it while its file was hashed whole against its hub "
    "blob name",
)

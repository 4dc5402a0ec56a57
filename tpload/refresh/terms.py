"""The refresh's words: the two strengths of check, its one error, the figures of a round, and the
defaults every side agrees on."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from ..model.errors import LoadError
from ..model.text import escape_name
from ..model.values import Json
from ..sources import hashing

TIMEOUT_S = 120.0
"""Every wait of a round (a peer's message, a chunk, the exchange): below vLLM's HTTP client's
300 s, so a dead trainer or engine rank fails the round with a message instead of the client timing
out."""
MAX_TIMEOUT_S = 299.0
CHUNK_BYTES = 8 << 20
"""The largest message a window is sent in: the memory a transfer holds per stream, bounded."""
IN_FLIGHT = 4
"""Chunks in flight per stream (trainer rank to engine rank): the wire stays busy between them;
what a stream holds at once is at most this many chunks."""
MAX_MESSAGE_BYTES = 1 << 30
"""The largest control message (a manifest, a rank's part) any member may send: a longer announced
length is refused before any allocation."""
MAX_LAYOUT_BYTES = 16 << 20
"""The engine layout (the model's config.json rides in it)."""
MAX_VERDICT_BYTES = 16 << 10
"""A verdict or an abort: one line."""
MAX_MANIFEST_BYTES = 256 << 20
"""The default bound on a version manifest an engine without a table yet accepts (with a table, the
bound is what that table's manifest can need)."""
MAX_VERSION = (1 << 63) - 1


def hash_threads(side_ranks: int, device: str) -> int:
    """Hash threads for one rank of a side (the trainer's or the engine's): sized to the cores it
    owns on its node, as a load's are (sources/hashing.py's ``hash_threads``), counting the side's
    processes on this node from torchrun's LOCAL_WORLD_SIZE where it is set (they share its cores),
    else the side's ranks (one node)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    node_ranks = int(local) if local.isdigit() and int(local) > 0 else side_ranks
    return hashing.hash_threads(None, node_ranks, device)


def version_problem(version: Json) -> str:
    """'' when ``version`` is a version (an int in 1..2**63-1), else why not."""
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        return f"version must be an integer in 1..2**63-1, got {escape_name(repr(version))[:40]}"
    return ""


class RefreshCheck(StrEnum):
    """How strongly each window is checked on receipt (docs/threat-model.md, "Refresh")."""

    FINGERPRINT = "fingerprint"
    """The loader's fingerprints (a checksum per window, the digest per rank): catches a window
    corrupted, truncated, reordered or lost in transport. Not a forgery built to keep the sums."""
    SHA256 = "sha256"
    """A sha256 per window in the manifest, the loader's hash taps over the staged bytes; with a
    signed manifest, a hostile wire is caught too."""


class RefreshError(LoadError):
    """A refresh round failed; nothing was handed over and the served version is unchanged.

    Raised on every engine rank with the same one line (from the round's exchange), naming the rank,
    the tensor and the version where there is one."""


@dataclass(frozen=True)
class RoundFigures:
    """What one round did, on one rank (the report's refresh entry)."""

    version: int
    """The version the round carried."""
    rank: int
    """The rank these figures are of (trainer or engine rank, as the side says)."""
    windows: int
    """Windows sent (trainer) or staged and checked (engine)."""
    bytes: int
    """Window bytes sent or staged."""
    seconds: float
    """From the round's start on this rank to its end (trainer: every window sent; engine: the
    verdict)."""
    check: RefreshCheck
    digests: tuple[str, ...] = ()
    """Each engine rank's digest (trainer rank 0: every rank's; an engine rank: its own)."""
    staged_bytes: int = 0
    """Engine: host bytes the staging holds (at most the budget)."""
    budget_bytes: int | None = None
    """Engine: the staging budget (None: unbounded)."""

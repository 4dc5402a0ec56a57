"""The named modes of a load (the command line and TOML keep their strings: each mode is a StrEnum)."""

from __future__ import annotations

from enum import StrEnum


class Verify(StrEnum):
    """How a load proves the bytes it serves (``--verify``; verification/gate.py owns each)."""

    NODE = "node"
    """Each tensor (or whole file) hashed once per node; peers' windows cross-checked in the exchange."""
    RANK = "rank"
    """Every rank hashes everything it serves."""
    DIGEST = "digest"
    """Every served byte fingerprinted against the operator's stored prediction; nothing hashed."""
    OFF = "off"
    """Nothing checked against the checkpoint (the report says so)."""

"""The named modes of a load (the command line and TOML keep their strings: each mode is a
StrEnum), how a rank's load ended, and the state of a rank's digest against a stored
prediction."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Verify(StrEnum):
    """How a load proves the bytes it serves (``--verify``; verification/gate.py owns each)."""

    NODE = "node"
    """Each tensor (or whole file) hashed once per node; peers' windows cross-checked in the
    exchange."""
    RANK = "rank"
    """Every rank hashes everything it serves."""
    DIGEST = "digest"
    """Every served byte fingerprinted against the operator's stored prediction; nothing hashed."""
    OFF = "off"
    """Nothing checked against the checkpoint (the report says so)."""


class Kind(StrEnum):
    """What a rank serves (``--kind``)."""

    PACKED = "packed"
    """The stored bytes as they are: quantized weights and their scales, each a window."""
    EXPANDED = "expanded"
    """Quantized weights decoded to BF16 on the device."""


class Split(StrEnum):
    """How tensor parallelism cuts a tensor (a rule's ``split``)."""

    ROWS = "rows"
    """Column parallel (or vocabulary parallel): each rank a window of rows."""
    COLS = "cols"
    """Row parallel: each rank a window of columns."""
    REPLICATE = "replicate"
    """Every rank the whole tensor."""


class Role(StrEnum):
    """What a rule makes of its tensors (a rule's ``role``): a codec's name, or one of the three
    roles no codec has."""

    PLAIN = "plain"
    FP4 = "fp4"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    GGUF = "gguf"
    AUTO = "auto"
    """The stored format decides, through the config's codec families."""
    SKIP = "skip"
    """Never read."""
    DEFER = "defer"
    """Not uploaded; a locator is returned."""


class RankStatus(IntEnum):
    """How a rank's load ended (a number: it rides in the exchanged row as ``failed``)."""

    OK = 0
    FAILED = 1
    """This rank failed: its message is a cause."""
    STOOD_DOWN = 2
    """This rank stopped because another failed (errors.StoodDown): its message points there."""


class PredictionState(IntEnum):
    """A rank's digest against the stored prediction for its layout (a number: it rides in the
    exchanged row)."""

    NONE = 0
    """No prediction stored for this layout."""
    MATCH = 1
    DIFFERS = 2

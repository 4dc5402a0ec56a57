"""A stored tensor as a header names it (:class:`TensorMeta`), and the bytes of each stored dtype.

Storage makes them (a safetensors header, a GGUF header, an export's manifest), planning and the
codecs read them: a value both sides share, so it stands on the data floor. Nothing here reads a
file or imports anything of tpload but the data floor."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .text import escape_name

_set = object.__setattr__

# Every safetensors dtype of whole bytes, with its size. Whether tpload *serves* a dtype is the
# codecs' business: an unserved tensor can still be skipped or deferred by a rule.
SAFETENSORS_ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
"""What a safetensors header may say (storage/safetensors.py reads no other dtype)."""
# GGUF's block-quantised types, seen as bytes: a tensor of them has the shape [..., rows, row bytes]
# (storage/gguf.py); the dtype keeps the type, so manifests and plans tell Q4_K from Q6_K.
ITEMSIZE: dict[str, int] = SAFETENSORS_ITEMSIZE | {
    t: 1 for t in ("Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
}
"""Bytes per element of every dtype a catalogue may hold."""


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """One stored tensor as a header names it, and as the planner sees it.

    Slotted: a catalogue holds one a tensor for the whole load, and an instance without a
    ``__dict__`` is one object for the collector to walk, not two."""

    name: str
    file: str
    """Shard file name, relative to the checkpoint directory (for messages)."""
    dtype: str
    """Stored dtype, safetensors spelling."""
    shape: tuple[int, ...]
    nbytes: int = field(init=False, repr=False, compare=False)
    rows: int = field(init=False, repr=False, compare=False)
    """Rows of the 2-D byte view ``[rows, row_bytes]`` (a 0-D or 1-D tensor is one row)."""
    row_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nbytes = math.prod(self.shape) * ITEMSIZE[self.dtype]
        rows = self.shape[0] if len(self.shape) > 1 else 1
        _set(self, "nbytes", nbytes)
        _set(self, "rows", rows)
        _set(self, "row_bytes", nbytes // rows if rows else 0)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def __eq__(self, other: object) -> bool:
        """The same tensor as the planner sees it: a TensorInfo (storage/safetensors.py) equals the
        TensorMeta of its four fields (the catalogue holds TensorInfos; a pre-partitioned export's
        holds TensorMetas)."""
        if not isinstance(other, TensorMeta):
            return NotImplemented
        return (self.name, self.file, self.dtype, self.shape) == (
            other.name,
            other.file,
            other.dtype,
            other.shape,
        )

    def describe(self) -> str:
        return (
            f"{escape_name(self.name)} ({escape_name(self.file)}, {self.dtype} {list(self.shape)})"
        )


class HeaderFields(dict[str, object]):
    """config.json's fields as a checkpoint's own header gives them instead (storage/gguf.py's
    ``HeaderConfig``): a dict, read as config.json is, that says where each field came from, so a
    message names the header rather than a config.json that is not there."""

    def source(self, field: str) -> str:
        """Where ``field`` comes from, in words."""
        raise NotImplementedError

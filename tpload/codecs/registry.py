"""The codecs by role: the config's ``role`` names the codec that reads a weight (None for ``skip``
and ``defer``, which read nothing)."""

from __future__ import annotations

import functools

from .base import Codec
from .fp4_e8m0 import FP4
from .fp8_block import FP8
from .gguf import GGUF_CODEC
from .nvfp4 import NVFP4_CODEC
from .plain import PLAIN
from .tables import SERVED


@functools.cache
def _registry() -> dict[str, Codec]:
    return {c.role: c for c in (PLAIN, FP4, FP8, NVFP4_CODEC, GGUF_CODEC)}


def for_role(role: str) -> Codec | None:
    """The codec a config role names (None for ``skip`` and ``defer``, which read nothing)."""
    return _registry().get(role)


@functools.cache
def roles() -> tuple[str, ...]:
    return tuple(_registry())


def by_role() -> dict[str, Codec]:
    """Every codec by the role that names it (a new dict: the caller's to keep)."""
    return dict(_registry())


@functools.cache
def scaled_roles() -> frozenset[str]:
    """The roles whose codec reads a scale beside the weight."""
    return frozenset(role for role, codec in _registry().items() if codec.scaled)


def served_dtypes() -> tuple[str, ...]:
    """Every stored dtype some codec serves, for messages."""
    return tuple(SERVED)

"""A verified weight refresh (docs/refresh.md): a trainer's new weights pushed into a running
engine, each engine rank sent only its windows, checked on receipt against a version manifest, and
handed over all or nothing. A refresh is a load whose read source is the trainer: the engine's
staging is a pre-partitioned export's rank file held in memory, loaded by the loader's own loop.

- :mod:`.terms`: :class:`RefreshCheck` (the two strengths), :class:`RefreshError`, the defaults;
- :mod:`.layout`: :class:`EngineLayout`, what engine rank 0 tells the trainer at connect;
- :mod:`.rendezvous`: a fresh torch.distributed group (never the engine's own), its framing;
- :mod:`.manifest`: :class:`VersionManifest`, the round's canonical, optionally signed statement;
- :mod:`.tensors`: the trainer's tensors as a storage, the engine's plan, the windows cut;
- :mod:`.trainer`: :class:`RefreshSender`, one per trainer rank;
- :mod:`.engine`: :class:`RefreshReceiver`, one per engine rank (an engine integration wraps it).

This face imports nothing: its names are imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

_LAZY = {
    "RefreshCheck": ".terms",
    "RefreshError": ".terms",
    "EngineLayout": ".layout",
    "Rendezvous": ".rendezvous",
    "open_rendezvous": ".rendezvous",
    "join": ".rendezvous",
    "VersionManifest": ".manifest",
    "RefreshSender": ".trainer",
    "RoundFigures": ".terms",
    "RefreshReceiver": ".engine",
}
__all__ = [
    "EngineLayout",
    "RefreshCheck",
    "RefreshError",
    "RefreshReceiver",
    "RefreshSender",
    "Rendezvous",
    "RoundFigures",
    "VersionManifest",
    "join",
    "open_rendezvous",
]  # sorted(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from .engine import RefreshReceiver
    from .layout import EngineLayout
    from .manifest import VersionManifest
    from .rendezvous import Rendezvous, join, open_rendezvous
    from .terms import RefreshCheck, RefreshError, RoundFigures
    from .trainer import RefreshSender


def __getattr__(name: str) -> Callable[..., object]:  # a function or a class of _LAZY
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: Callable[..., object] = getattr(importlib.import_module(module, __name__), name)
    return value

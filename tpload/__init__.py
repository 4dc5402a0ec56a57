"""tpload: a tensor-parallel, verified checkpoint loader for mixture-of-experts models.

``import tpload`` is cheap: :func:`load` and the rest import torch and the
compiled kernels on first use, so a plugin can register tpload without
paying for it, and the command line can say what it is doing first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_LAZY = {
    "load": ".api",
    "RankShards": ".api",
    "LoadOptions": ".options",
    "LoadError": ".errors",
    "CheckpointError": ".errors",
    "ConfigError": ".errors",
    "LayoutError": ".errors",
    "OptionsError": ".errors",
}
__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .api import RankShards, load
    from .errors import CheckpointError, ConfigError, LayoutError, LoadError, OptionsError
    from .options import LoadOptions


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpload' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)

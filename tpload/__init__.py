"""tpload: a tensor-parallel, verified checkpoint loader for mixture-of-experts models.

``import tpload`` is cheap: :func:`load` and the rest import torch and the
compiled kernels on first use, so a plugin can register tpload without
paying for it, and the command line can say what it is doing first.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_LAZY = {
    "load": ".api",
    "RankShards": ".loading.shards",
    "LoadOptions": ".options.load_options",
    "LoadError": ".model.errors",
    "CheckpointError": ".model.errors",
    "ConfigError": ".model.errors",
    "LayoutError": ".model.errors",
    "OptionsError": ".model.errors",
}
__all__ = [
    "CheckpointError",
    "ConfigError",
    "LayoutError",
    "LoadError",
    "LoadOptions",
    "OptionsError",
    "RankShards",
    "load",
    "__version__",
]  # sorted(_LAZY) and the version

if TYPE_CHECKING:  # pragma: no cover
    from .api import load
    from .loading.shards import RankShards
    from .model.errors import CheckpointError, ConfigError, LayoutError, LoadError, OptionsError
    from .options.load_options import LoadOptions


def __getattr__(name: str) -> Callable[..., object]:  # a function or a class of _LAZY
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpload' has no attribute {name!r}")
    value: Callable[..., object]
    if __name__ + module in sys.modules:
        value = getattr(sys.modules[__name__ + module], name)
        return value
    started = time.perf_counter_ns()
    value = getattr(importlib.import_module(module, __name__), name)
    elapsed = time.perf_counter_ns() - started
    # the first call's figure counts these imports (model/figures.py); imported here, not at the
    # top, so that importing a submodule (the gate's kernel) does not run it
    from .report.imports import add_load_path_import_ns

    add_load_path_import_ns(elapsed)
    return value


def __dir__() -> list[str]:
    """The API (``__all__``: ``load``, the errors, ``LoadOptions``...), found lazily, rather than
    this module's own imports (``sys``, ``time``): what ``dir(tpload)`` and completion show."""
    return sorted(__all__)

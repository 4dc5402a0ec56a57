"""The compiled kernels, imported on first use: planning needs the codecs' rules but not their
kernels, and importing numba and loading the kernels costs about a second (``tpload plan``)."""

from __future__ import annotations

import importlib
from types import ModuleType


class _Kernels:
    """Stands for :mod:`tpload.kernels` until an attribute of it is first asked for."""

    def __getattr__(self, name: str) -> object:
        module: ModuleType = importlib.import_module("tpload.kernels")
        return getattr(module, name)


kernels = _Kernels()

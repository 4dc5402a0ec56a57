"""How long this process spent importing tpload's load path: the part of the first call's figure
(model/figures.py's ``first_call_ns``) spent before the load began, counted on the process's first
``load()`` only. The package's lazy door
(tpload/__init__.py) adds what each first ask for one of its names cost; this module imports
nothing, so ``import tpload`` stays cheap."""

from __future__ import annotations

import itertools

__all__ = ["add_load_path_import_ns", "first_load_imports_ns", "load_path_import_ns"]

_LOAD_PATH_IMPORT_NS = 0
_LOADS = itertools.count()
"""``load()`` calls this process began (a counter, as the exchange's sequence numbers are)."""


def add_load_path_import_ns(ns: int) -> None:
    """Count ``ns`` nanoseconds of importing tpload's modules (the lazy door, on first use)."""
    global _LOAD_PATH_IMPORT_NS
    _LOAD_PATH_IMPORT_NS += ns


def load_path_import_ns() -> int:
    """Nanoseconds this process spent importing tpload's modules on first asking for one of its
    names (``tpload.load``: the load path, torch's and numpy's own imports aside when they were
    there already); 0 when they were imported directly (``import tpload.api``)."""
    return _LOAD_PATH_IMPORT_NS


def first_load_imports_ns() -> int | None:
    """Called once by every ``load()``: on the process's first, :func:`load_path_import_ns` (the
    first call's figure counts it); None on every later one."""
    return load_path_import_ns() if next(_LOADS) == 0 else None

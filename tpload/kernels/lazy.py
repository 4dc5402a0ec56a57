"""The compiled kernels, imported on first use, and warmed beside a load's first steps.

Planning needs the codecs' rules but not their kernels, and importing numba and loading the kernels
from its cache is the larger part of a process's first load (``tpload plan`` needs none of it). So
every user of :mod:`tpload.kernels.compiled` in the load path holds :data:`kernels`, which imports
the module on its first attribute; and :func:`warm` starts that import on a thread when a load
begins, so it overlaps the load's own first steps (the rendezvous, the headers, the plan) instead of
standing before them. A kernel asked for while the thread is still importing waits for it (Python's
per-module import lock), so nothing runs half-loaded.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["kernels", "warm"]

log = logging.getLogger("tpload")

_MODULE = "tpload.kernels.compiled"


class _Kernels:
    """Stands for :mod:`tpload.kernels.compiled` until an attribute of it is first asked for; the
    module is then kept, and every attribute is read from it (so a test's monkeypatch of it is
    seen)."""

    _module: ModuleType | None = None

    def __getattr__(self, name: str) -> Callable[..., Any]:  # a compiled kernel
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(_MODULE)
        kernel: Callable[..., Any] = getattr(module, name)
        return kernel


if TYPE_CHECKING:  # a type checker reads the module's own names (none is imported here)
    from . import compiled as kernels
else:
    kernels = _Kernels()


def warm() -> threading.Thread | None:
    """Import the kernels on a thread (numba, and its cache of the compiled kernels), unless they
    are imported already; the thread, or None. It ends when the import does.

    Not a daemon: a process can end before the import does (a load that needed no kernel, or
    failed early; the main thread holds the GIL most of a load, so the import crawls), and a daemon
    thread stopped by the interpreter's exit inside LLVM's C++ takes the process down with
    ``std::terminate`` (SIGABRT, not the exit code the program chose). Python's exit waits for a
    non-daemon thread."""
    if _MODULE in sys.modules:
        return None
    thread = threading.Thread(target=_import, name="tpload-kernels")
    thread.start()
    return thread


def _import() -> None:
    try:
        importlib.import_module(_MODULE)
    except Exception:  # the load imports it again where it needs it, and says why there
        log.debug("warming the kernels failed; the load imports them when needed", exc_info=True)

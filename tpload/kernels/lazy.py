"""The compiled kernels, loaded on first use, and warmed beside a load's first steps.

Planning needs the codecs' rules but not their kernels, and importing numba and loading the kernels
from its cache is the larger part of a process's first load (``tpload plan`` needs none of it). So
every user of the kernels in the load path holds :data:`kernels`, which loads them on its first
attribute: the ahead-of-time module when a valid one is built (:mod:`.ahead`: no numba at all),
else :mod:`tpload.kernels.compiled` (numba, and its cache). Both give the same names
(:data:`.calls.PUBLIC`) and the same bits. :func:`warm` starts that load on a thread when a load
begins, so it overlaps the load's own first steps (the rendezvous, the headers, the plan) instead
of standing before them. A kernel asked for while the thread is still loading waits for it, so
nothing runs half-loaded.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__all__ = ["kernels", "warm"]

log = logging.getLogger("tpload")

_MODULE = "tpload.kernels.compiled"


class _Kernels:
    """Stands for the kernels until an attribute of them is first asked for; they are then kept
    (``_module``: a :class:`.calls.Kernels`, the ahead-of-time module's or compiled.py's), and
    every attribute is read from them."""

    _module: Any = None
    _lock = threading.Lock()

    def __getattr__(self, name: str) -> Callable[..., Any]:  # a compiled kernel
        module = self._module
        if module is None:
            module = self._load()
        kernel: Callable[..., Any] = getattr(module, name)
        return kernel

    def _load(self) -> Any:
        """The kernels, loaded once: the ahead-of-time module's when there is a valid one, else
        numba's."""
        with self._lock:
            if self._module is None:
                from . import ahead

                found = ahead.load()
                self._module = (
                    found if found is not None else importlib.import_module(_MODULE).KERNELS
                )
            return self._module


_PROXY = _Kernels()

if TYPE_CHECKING:  # a type checker reads the module's own names (none is imported here)
    from . import compiled as kernels
else:
    kernels = _PROXY


def warm() -> threading.Thread | None:
    """Load the kernels on a thread (the ahead-of-time module, or numba and its cache of the
    compiled kernels), unless they are loaded already; the thread, or None. It ends when the load
    does.

    Not a daemon: a process can end before the import does (a load that needed no kernel, or
    failed early; the main thread holds the GIL most of a load, so the import crawls), and a daemon
    thread stopped by the interpreter's exit inside LLVM's C++ takes the process down with
    ``std::terminate`` (SIGABRT, not the exit code the program chose). Python's exit waits for a
    non-daemon thread."""
    if _PROXY._module is not None:
        return None
    thread = threading.Thread(target=_import, name="tpload-kernels")
    thread.start()
    return thread


def _import() -> None:
    try:
        _PROXY._load()
    except Exception:  # the load imports them again where it needs them, and says why there
        log.debug("warming the kernels failed; the load imports them when needed", exc_info=True)

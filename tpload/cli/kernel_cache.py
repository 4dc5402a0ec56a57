"""Where numba keeps tpload's compiled CPU kernels, found without importing numba (the first run's
note is said before the compile it announces, and numba's import is most of it).

numba (``cache=True``) writes ``compiled.FUNC-LINE.pyXY.nbi`` (the index) and ``.nbc`` files for
``tpload/kernels/compiled.py``, in the first of: ``$NUMBA_CACHE_DIR/kernels_SHA1`` when that is set;
``tpload/kernels/__pycache__`` when it can write there; its user-wide cache,
``$XDG_CACHE_HOME/numba/kernels_SHA1`` (else ``~/.cache/numba/...``), where SHA1 is the sha1 of the
kernels folder's absolute path (numba's ``get_suitable_cache_subpath``). The kernels compiled ahead
(``python -m tpload kernels``: kernels/ahead.py) are kept in the same folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..kernels.ahead import subpath

KERNELS = Path(__file__).parents[1] / "kernels"
"""The folder of the module numba compiles (``compiled.py``)."""


def _writable(folder: Path) -> bool:
    """Whether numba can keep its cache in ``folder``: it makes the folder and writes a temporary
    file in it, as numba's own check does (``ensure_cache_path``)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def kernel_cache(source: Path | None = None) -> Path:
    """The folder numba keeps (or will keep) the compiled kernels of ``source`` (default
    :data:`KERNELS`) in."""
    source = source or KERNELS
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return Path(given) / subpath(source)
    in_tree = source / "__pycache__"
    if _writable(in_tree):
        return in_tree
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "numba" / subpath(source)


def compiled(folder: Path) -> bool:
    """Whether ``folder`` holds numba's index of ``compiled.py``'s kernels (loaded from there)."""
    return any(folder.glob("compiled.*.nbi"))

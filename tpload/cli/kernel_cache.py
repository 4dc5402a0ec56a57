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

import tempfile
from pathlib import Path

from ..kernels.ahead import cache_folders

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
    :data:`KERNELS`) in: the first of its folders (kernels/ahead.py's ``cache_folders``) it can
    write in, the last whatever it is."""
    *tried, last = cache_folders(source or KERNELS)
    return next((folder for folder in tried if _writable(folder)), last)


def compiled(folder: Path) -> bool:
    """Whether ``folder`` holds numba's index of ``compiled.py``'s kernels (loaded from there)."""
    return any(folder.glob("compiled.*.nbi"))

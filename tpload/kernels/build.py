"""Compile the kernels ahead into one extension module (kernels/ahead.py loads it): numba's AOT
compiler (``numba.pycc``) over the same Python functions and the signatures compiled.py and gguf.py
declare (compiled.py's ``exports``).

Run by ``python -m tpload kernels`` (once a machine, like a warm-up; about half a minute), or as
``python -m tpload.kernels.build [FOLDER]``: in a process of its own, since it imports numba and
compiles every kernel.

The kernels release the GIL while they run (compiled.py's ``nogil=True``: hash threads run beside
the copy), and numba.pycc's wrappers do not unless told: it compiles each export with a default
``Flags()``, so for the build's span its ``Flags`` is one that releases the GIL
(``_ReleaseGil``), which is what ``njit(nogil=True)`` sets; a numba whose pycc no longer makes its
flags there fails the build (numba's kernels are used then) instead of building a module that holds
the GIL. tests/unit/kernels/test_ahead.py checks the GIL is released, without timing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from . import ahead


def _arg(t: Any) -> ahead.Arg:
    """A numba argument type as the stamp keeps it (:data:`.ahead.Arg`)."""
    from numba.core import types

    if isinstance(t, types.Array):
        if t.layout != "C":
            raise ValueError(f"only C-contiguous arrays are checked, not {t}")
        return [str(t.dtype), t.ndim, t.mutable]
    return None


def build(folder: Path) -> Path:
    """Build this process's module (:func:`.ahead.key`) into ``folder``; the module's path. Other
    keys' modules there (stale: other source, numba, Python or CPU) are removed."""
    import numba.pycc.compiler
    from numba.core.compiler import Flags
    from numba.pycc import CC

    from . import compiled

    made: list[Any] = []

    class _ReleaseGil(Flags):  # type: ignore[misc]  # numba's, untyped
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True
            made.append(self)

    k = ahead.key()
    name = ahead.module_name(k)
    folder.mkdir(parents=True, exist_ok=True)
    exports = compiled.exports()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.target_cpu = "host"  # this CPU's instructions, as numba's JIT compiles (in the key)
        stamp: dict[str, Any] = {"key": k, "exports": {}}
        for export, (function, sig) in exports.items():
            cc.export(export, sig)(function)
            stamp["exports"][export] = {"args": [_arg(t) for t in sig.args]}
        with mock.patch.object(numba.pycc.compiler, "Flags", _ReleaseGil):
            cc.compile()
        if not made:  # another numba that no longer compiles its exports with these flags
            raise RuntimeError(
                f"numba {numba.__version__}'s pycc did not take flags that release the GIL"
            )
        built = Path(tmp) / cc.output_file
        stamp["sha256"] = ahead.digest(built)
        module, stamp_path = ahead.paths(folder, k)
        stamp_path.write_text(json.dumps(stamp))  # the stamp first: the module's presence says done
        os.replace(built, module)
    for old in folder.glob(ahead.PREFIX + "*"):
        if not old.name.startswith(name):
            old.unlink(missing_ok=True)
    return module


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else ahead.cache_folders()[0]
    t = time.perf_counter()
    module = build(folder)
    print(f"built {module} in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

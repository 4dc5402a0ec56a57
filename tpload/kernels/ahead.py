"""The kernels compiled ahead into an extension module: found, checked and loaded without numba.

numba's own cache still costs a process's first load about 0.65 s beyond ``import torch`` (numba's
import, the numpy implementations its CPU target registers, the machine code's load:
docs/benchmarks.md). ``python -m tpload kernels`` (kernels/build.py) compiles the same kernels
(GGUF's decodes too), the same source with the signatures compiled.py and gguf.py declare, once into
one extension module, kept beside numba's cache (:func:`cache_folders`); importing it imports no
numba.

The module's name holds :func:`key`, a hash of what its machine code depends on: the kernels' source
(:data:`SOURCES`), numba's and llvmlite's versions, numpy's, Python's, and the CPU (it is
compiled for this CPU's instructions). A module built from other source, by another numba, or for
another CPU has another name, so it is never looked for; one whose bytes are not those its stamp
records (a damaged file: checked before the dynamic loader maps it), or that fails to import, is
passed over, with a warning, for numba's kernels.

``TPLOAD_KERNELS=numba`` in the environment passes over the ahead-of-time module (the comparison a
benchmark makes); anything else takes it when a valid one is there.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the kernels' Python side are imported by load(), not here: the first
    from .calls import Kernels  # run's note (cli/load.py) asks find() before torch's import

log = logging.getLogger("tpload")

KERNELS = Path(__file__).parent
"""The kernels' folder (numba's cache of compiled.py is named after it)."""
SOURCES = ("compiled.py", "gguf.py", "build.py")
"""What the module's machine code is built from, in :data:`KERNELS`."""
PREFIX = "_tpload_kernels_"
"""The module's name is this and its :func:`key`; its stamp is the name with ``.json``."""


def subpath(source: Path) -> str:
    """numba's name for a source folder's cache under a user-wide folder (its
    ``get_suitable_cache_subpath``)."""
    folder = os.path.abspath(source)
    return f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"


def cache_folders(source: Path | None = None) -> list[Path]:
    """Where numba keeps (or would keep) the compiled kernels of ``source`` (default
    :data:`KERNELS`), in the order it tries them: ``$NUMBA_CACHE_DIR/kernels_SHA1`` when that is
    set; else the folder's ``__pycache__``, then ``$XDG_CACHE_HOME/numba/kernels_SHA1`` (else
    ``~/.cache/numba/...``). The ahead-of-time module is kept in the first one that is writable
    (cli/kernel_cache.py) and looked for in each."""
    source = source or KERNELS
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return [Path(given) / subpath(source)]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return [source / "__pycache__", Path(base) / "numba" / subpath(source)]


def _version(package: str, file: str = "_version.py") -> bytes:
    """A package's version file (read, not imported: numba's import is what this module avoids)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return b"absent"
    try:
        return (Path(spec.origin).parent / file).read_bytes()
    except OSError:
        return Path(spec.origin).parent.as_posix().encode()


def cpu() -> str:
    """This CPU's model and instruction sets (the module is compiled for them): /proc/cpuinfo's
    first processor's, else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first = []
            for line in f:
                if not line.strip():
                    break
                if line.split(":")[0].strip() in ("vendor_id", "model name", "flags", "Features"):
                    first.append(line.strip())
        if first:
            return "\n".join(first)
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def key() -> str:
    """The hash in the module's name: of what its machine code depends on (the module's doc)."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((KERNELS / name).read_bytes())
    for part in (
        _version("numba"),
        _version("llvmlite"),
        _version("numpy", "version.py"),
        sys.version.encode(),
        str(importlib.machinery.EXTENSION_SUFFIXES[0]).encode(),
        cpu().encode(),
    ):
        h.update(b"\0" + part)
    return h.hexdigest()[:20]


def module_name(k: str | None = None) -> str:
    return PREFIX + (k or key())


def paths(folder: Path, k: str | None = None) -> tuple[Path, Path]:
    """(the extension module, its stamp) of key ``k`` (default: this process's) in ``folder``."""
    name = module_name(k)
    return folder / (name + importlib.machinery.EXTENSION_SUFFIXES[0]), folder / (name + ".json")


def find(folders: list[Path] | None = None, k: str | None = None) -> Path | None:
    """The folder holding the ahead-of-time module of key ``k`` (default: this process's) with its
    stamp, or None."""
    k = k or key()
    for folder in cache_folders() if folders is None else folders:
        module, stamp = paths(folder, k)
        if module.is_file() and stamp.is_file():
            return folder
    return None


def load(folders: list[Path] | None = None) -> Kernels | None:
    """The ahead-of-time kernels, or None: none built for this source, numba, Python and CPU, or
    passed over by ``TPLOAD_KERNELS=numba``, or one that fails its checks (said, as a warning)."""
    if os.environ.get("TPLOAD_KERNELS") == "numba":
        return None
    from .calls import RAW, Kernels

    k = key()
    folder = find(folders, k)
    if folder is None:
        return None
    module_path, stamp_path = paths(folder, k)
    try:
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("key") != k or set(stamp.get("exports", ())) != set(RAW):
            raise ValueError(f"its stamp {stamp_path} is not this module's")
        if stamp.get("sha256") != digest(module_path):  # before the dynamic loader maps it
            raise ValueError(f"{module_path} is not the file that was built (damaged)")
        name = module_name(k)
        spec = importlib.util.spec_from_file_location(name, module_path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {module_path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        raw = {n: _checked(n, getattr(module, n), stamp["exports"][n]["args"]) for n in RAW}
    except Exception as e:  # a damaged file: numba's kernels instead
        log.warning(
            "tpload's ahead-of-time kernels in %s could not be used (%s: %s); using numba's "
            "(`python -m tpload kernels` builds them again)",
            folder,
            type(e).__name__,
            e,
        )
        return None
    return Kernels(raw, "ahead")


def digest(path: Path) -> str:
    """The sha256 of a built module (its stamp keeps it: about a millisecond to check)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


Arg = list[Any] | None
"""An argument's type in the stamp: ``[dtype, ndim, writable]`` for an array (C-contiguous,
aligned), None for a scalar."""


def _checked(name: str, kernel: Callable[..., Any], args: list[Arg]) -> Callable[..., Any]:
    """``kernel`` behind the checks numba's dispatcher makes of its array arguments: the
    extension's own wrapper takes any array of the element size, and the kernels run without bounds
    checks, so an array of the wrong dtype, shape or layout is refused here (TypeError, as numba
    does) instead of being read wrongly."""
    import numpy as np

    arrays = [(i, np.dtype(a[0]), int(a[1]), bool(a[2])) for i, a in enumerate(args) if a]
    count = len(args)

    def call(*values: Any) -> Any:
        if len(values) != count:
            raise TypeError(f"{name}: {count} arguments expected, {len(values)} given")
        for i, dtype, ndim, writable in arrays:
            a = values[i]
            if not (
                isinstance(a, np.ndarray)
                and a.dtype == dtype
                and a.ndim == ndim
                and a.flags.c_contiguous
                and a.flags.aligned
                and (a.flags.writeable or not writable)
            ):
                raise TypeError(
                    f"{name}: argument {i} must be a C-contiguous {'writable ' if writable else ''}"
                    f"{dtype}[{ndim}-D] array, got {_describe(a)}"
                )
        return kernel(*values)

    call.__name__ = call.__qualname__ = name
    return call


def _describe(a: object) -> str:
    import numpy as np

    if not isinstance(a, np.ndarray):
        return type(a).__name__
    f = a.flags
    return (
        f"{a.dtype}[{a.ndim}-D]{'' if f.c_contiguous else ' not contiguous'}"
        f"{'' if f.aligned else ' misaligned'}{'' if f.writeable else ' read-only'}"
    )

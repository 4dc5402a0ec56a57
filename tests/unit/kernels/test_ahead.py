"""The kernels compiled ahead (kernels/ahead.py, kernels/build.py): they release the GIL as numba's
do, a stale or damaged module is never used (numba's kernels are, without a crash), and loading
them (a GGUF decode's too) imports no numba. (That they agree bit for bit with numba's: every test
of test_compiled.py, test_fingerprint.py, test_gguf.py and test_stacked_views.py runs over both
implementations.)"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tpload.kernels import ahead, lazy
from tpload.kernels.calls import RAW, Kernels

from .conftest import numba_cache_dir


@pytest.mark.parametrize("kernel", ["copy_fingerprint", "decode_gguf"])
def test_a_kernel_releases_the_gil_while_it_runs(implementation: Kernels, kernel: str) -> None:
    # With a switch interval of 1000 s the GIL changes hands only where a thread gives it up: the
    # main thread can run while the worker is inside a kernel (inside set, not yet cleared) only if
    # the kernel released the GIL. Without it, the worker holds the GIL from `inside = True` to
    # `inside = False` and the main thread never sees True, however long the kernel runs.
    if kernel == "copy_fingerprint":
        words = np.ones(1 << 22, dtype=np.int64)
        col_sums = np.zeros(1 << 10, dtype=np.int64)
        empty = np.empty(0, dtype=np.int64)

        def run() -> None:
            implementation.copy_fingerprint(words, 0, 1 << 10, 1 << 12, 1 << 10, empty, col_sums, 0)
    else:  # GGUF's decodes: 4096 rows of 32 Q8_0 blocks (scales 0: finite)
        q8 = np.zeros((1 << 12, 32 * 34), dtype=np.uint8)
        bf16 = np.empty((1 << 12, 32 * 32), dtype=np.int16)

        def run() -> None:
            implementation.decode_gguf("Q8_0", q8, bf16)

    state = {"inside": False, "seen": False}

    def work() -> None:
        for _ in range(50):
            if state["seen"]:
                return
            state["inside"] = True
            run()
            state["inside"] = False

    before = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        while worker.is_alive() and not state["seen"]:
            time.sleep(0.001)  # gives the GIL up: the worker runs until it gives it up in turn
            state["seen"] = state["inside"]
        worker.join()
    finally:
        sys.setswitchinterval(before)
    assert state["seen"], f"{implementation.implementation}'s kernel held the GIL while it ran"


def test_the_module_is_found_where_numba_keeps_its_cache(
    ahead_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(numba_cache_dir(ahead_folder)))
    assert ahead.cache_folders() == [ahead_folder]
    assert ahead.find() == ahead_folder
    module, stamp = ahead.paths(ahead_folder)
    assert module.name.startswith(ahead.PREFIX + ahead.key()) and stamp.is_file()
    fresh = lazy._Kernels()
    assert fresh.wrap64(1 << 63) == -(1 << 63)
    assert fresh._module.implementation == "ahead"
    monkeypatch.setenv("TPLOAD_KERNELS", "numba")  # passed over: numba's
    assert ahead.load() is None
    assert lazy._Kernels().cols_term(np.arange(3, dtype=np.int64)) == 8


def test_the_key_changes_with_the_source_numba_python_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k = ahead.key()
    for name in ahead.SOURCES:
        (tmp_path / name).write_bytes((ahead.KERNELS / name).read_bytes())
    monkeypatch.setattr(ahead, "KERNELS", tmp_path)
    assert ahead.key() == k
    for name in ("compiled.py", "gguf.py"):  # GGUF's decodes are in the module too
        before = ahead.key()
        with (tmp_path / name).open("a") as f:
            f.write("\n# an edit\n")
        assert ahead.key() not in (k, before)
    monkeypatch.undo()
    monkeypatch.setattr(ahead, "cpu", lambda: "another CPU")
    assert ahead.key() != k
    monkeypatch.undo()
    monkeypatch.setattr(ahead, "_version", lambda *package: b"version = '9.9'")
    assert ahead.key() != k


def test_a_stale_module_is_never_looked_for(copied: Path) -> None:
    # built from other source (or numba, Python, CPU): another key, so another name
    module, stamp = ahead.paths(copied)
    other = "0" * len(ahead.key())
    module.rename(ahead.paths(copied, other)[0])
    stamp.rename(ahead.paths(copied, other)[1])
    assert ahead.find([copied]) is None and ahead.load([copied]) is None


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stamp", "exports", "no stamp"])
def test_a_damaged_module_falls_back_to_numba_with_a_warning(
    copied: Path, damage: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    module, stamp = ahead.paths(copied)
    if damage == "garbage":
        module.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        module.write_bytes(module.read_bytes()[: module.stat().st_size // 2])
    elif damage == "stamp":
        stamp.write_text("{not json")
    elif damage == "exports":
        data = json.loads(stamp.read_text())
        del data["exports"][RAW[0]]
        stamp.write_text(json.dumps(data))
    else:
        stamp.unlink()
    caplog.set_level(logging.WARNING, logger="tpload")
    assert ahead.load([copied]) is None
    if damage != "no stamp":  # an incomplete build is not there yet: nothing to say
        assert any("could not be used" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(ahead, "cache_folders", lambda: [copied])
    fresh = lazy._Kernels()
    assert fresh.cols_term(np.arange(3, dtype=np.int64)) == 8
    assert fresh._module.implementation == "numba"


def test_arrays_numba_would_refuse_are_refused(ahead_kernels: Kernels) -> None:
    good = np.arange(4, dtype=np.int64)
    assert ahead_kernels.cols_term(good) == 20
    for bad in (good.astype(np.int32), good[::2], good.reshape(2, 2), [0, 1, 2, 3]):
        with pytest.raises(TypeError, match="cols_term: argument 0"):
            ahead_kernels.cols_term(bad)
    frozen = good.copy()
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        ahead_kernels.cols_term(frozen)  # numba's signature wants a writable array
    with pytest.raises(TypeError, match="arguments"):
        ahead_kernels.cols_term(good, good)


def with_the_module(ahead_folder: Path, code: str) -> str:
    """What ``code`` prints, run in a fresh process that finds the module in ``ahead_folder``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(numba_cache_dir(ahead_folder)))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_process_loads_them_without_numba(ahead_folder: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from tpload.kernels.fingerprint import host_fingerprint\n"
        "from tpload.kernels.lazy import kernels\n"
        "window = np.arange(96, dtype=np.uint8).reshape(6, 16)\n"
        "print(host_fingerprint(window), kernels._module.implementation, 'numba' in sys.modules)\n"
    )
    out = with_the_module(ahead_folder, code)
    from tpload.kernels.fingerprint import host_fingerprint

    want = host_fingerprint(np.arange(96, dtype=np.uint8).reshape(6, 16))
    assert out.split(")")[1].split() == ["ahead", "False"]
    assert out.startswith(str(want))


def test_a_gguf_decode_with_the_module_built_imports_no_numba(ahead_folder: Path) -> None:
    # the codec's host decode, as a GGUF load makes it: Q8_0 blocks of d = 1.0 (f16 0x3c00), q = 3
    code = (
        "import sys, numpy as np, torch\n"
        "from tpload.codecs.gguf import GGUF_CODEC\n"
        "from tpload.kernels.lazy import kernels\n"
        "from tpload.model.meta import TensorMeta\n"
        "raw = np.full((2, 34), 3, np.uint8)\n"
        "raw[:, :2] = (0x00, 0x3C)\n"
        "fit = GGUF_CODEC.fit(TensorMeta('t', 'm.gguf', 'Q8_0', (2, 34)), None)\n"
        "out = torch.zeros(2, 32, dtype=torch.bfloat16)\n"
        "GGUF_CODEC.decode(raw, None, out, fit)\n"
        "print(out.unique().tolist(), kernels._module.implementation, 'numba' in sys.modules)\n"
    )
    assert with_the_module(ahead_folder, code).split() == ["[3.0]", "ahead", "False"]

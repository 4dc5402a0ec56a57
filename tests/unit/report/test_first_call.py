"""The first-call figure: what it counts, how it travels, and the lazy kernels behind it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import pytest

from tpload.kernels import lazy as _lazy
from tpload.model.figures import RankFigures
from tpload.report import imports as imports_module
from tpload.report.render import LoadReport


def test_only_the_process_first_load_is_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports_module, "_LOADS", itertools.count())
    monkeypatch.setattr(imports_module, "_LOAD_PATH_IMPORT_NS", 7)
    assert [imports_module.first_load_imports_ns() for _ in range(3)] == [7, None, None]


def test_the_first_read_counts_from_the_entry_and_the_first_call_adds_the_imports() -> None:
    fig = RankFigures()
    fig.read_started(time.perf_counter_ns() - 50_000_000, imports_ns=7_000_000)
    assert 50_000_000 <= fig.first_read_ns < 10**10
    assert fig.first_call_ns == fig.first_read_ns + 7_000_000
    later = RankFigures()
    later.read_started(time.perf_counter_ns(), imports_ns=None)
    assert later.first_read_ns is not None and later.first_call_ns is None
    assert later.first_call_seconds is None


def test_the_figure_travels_in_the_row_and_the_json() -> None:
    fig = RankFigures(rank=0, first_read_ns=400_000_000, first_call_ns=500_000_000)
    back = RankFigures.from_row(fig.to_row())
    assert back.first_call_seconds == 0.5 and back.first_read_ns == 400_000_000
    assert RankFigures.from_row(RankFigures().to_row()).first_call_ns is None
    whole = LoadReport("ckpt", "packed", 1, 1, "node", "cpu", ranks=[back])
    report = json.loads(whole.to_json())
    assert report["ranks"][0]["first_call_seconds"] == 0.5


def test_the_load_path_imports_no_numba() -> None:
    code = "import sys, torch, tpload; tpload.load; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # the kernels load on a thread when a load begins


def test_warming_loads_the_kernels_once() -> None:
    thread = _lazy.warm()
    if thread is not None:
        thread.join(120)
    kept = _lazy.kernels._module  # numba's, or the ahead-of-time module's where one is built
    assert kept is not None and kept.implementation in ("numba", "ahead")
    assert _lazy.warm() is None  # loaded: nothing to start
    assert callable(_lazy.kernels.wrap64)
    assert _lazy.kernels._module is kept  # kept, and read each time


def test_a_process_that_ends_while_the_kernels_import_waits_for_the_import() -> None:
    # the interpreter's exit used to stop the warming thread wherever it was; inside LLVM's C++
    # that is std::terminate (SIGABRT: a torchrun worker that had finished its work died with -6).
    # Python's exit joins a non-daemon thread before the atexit handlers, so there it has ended.
    code = (
        "import atexit, sys\n"
        "from tpload.kernels.lazy import warm\n"
        "t = warm()\n"
        "atexit.register(lambda: print(t.is_alive(), 'tpload.kernels.compiled' in sys.modules))\n"
    )
    env = dict(os.environ, TPLOAD_KERNELS="numba")  # numba's kernels, even where some are built
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout

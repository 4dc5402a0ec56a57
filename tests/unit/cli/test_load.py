"""The load command's process-wide choices (tpload/cli/load.py): only the command, which owns its
process, sets a collector policy (the library's calls set none: tests/unit/planning)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import tpload
from tpload.cli.load import collector_policy

ROOT = Path(__file__).parents[3]


def test_the_command_freezes_the_imports_and_keeps_the_collector_on() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's default (a command run in this process set its own)
    try:
        garbage: list[object] = [object() for _ in range(100)]
        collector_policy()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0  # what existed then is out of the collector's walks
        assert gc.get_threshold()[0] > 700  # young collections are rarer
        del garbage
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_first_line_comes_before_torch_is_imported(small_ckpt: Path) -> None:
    # the first tpload line a load logs, and whether torch was imported by then (the process ends
    # there: a handler that reports and exits)
    code = (
        "import logging, os, sys\n"
        "class First(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        print('torch' in sys.modules, record.getMessage(), flush=True)\n"
        "        os._exit(0)\n"
        "logging.getLogger('tpload').addHandler(First())\n"
        "from tpload.cli import main\n"
        f"main([{str(small_ckpt)!r}])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    ).stdout
    assert out.startswith(f"False tpload {tpload.__version__}: loading {small_ckpt} at tp 1"), out

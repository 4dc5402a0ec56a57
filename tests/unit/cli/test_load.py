"""The load command's process-wide choices (tpload/cli/load.py): only the command, which owns its
process, sets a collector policy (the library's calls set none: tests/unit/planning)."""

from __future__ import annotations

import gc

from tpload.cli.load import collector_policy


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

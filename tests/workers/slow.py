"""``python -m tpload`` (the command line, as run by ``python -m`` or torchrun), with one rank's
copy loop slowed: a stalled disk or node, for the tests of progress, stragglers and Ctrl-C.

Environment: ``SLOW_RANK`` (the rank slowed; default every rank), ``SLOW_S`` (seconds each served
tensor or batch takes longer), ``SLOW_MARK`` (a file each slowed rank creates when its loop reads
its first tensor: a test waits for it before sending a signal). argv: tpload's own.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from tpload.loading import loop


def slowed(step):  # noqa: ANN001, ANN202  a test hook around the loop's per-tensor progress call
    mark = os.environ.get("SLOW_MARK")

    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if mark:
            Path(f"{mark}.{os.environ.get('RANK', '0')}").touch()
        time.sleep(float(os.environ.get("SLOW_S", "0.2")))
        return step(*args, **kwargs)

    return run


if os.environ.get("SLOW_RANK", os.environ.get("RANK", "0")) == os.environ.get("RANK", "0"):
    loop._advance, loop._advance_all = slowed(loop._advance), slowed(loop._advance_all)
sys.argv = ["tpload", *sys.argv[1:]]
runpy.run_module("tpload", run_name="__main__", alter_sys=True)

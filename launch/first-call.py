"""A process's first load: what it pays once (imports, the kernels' load: the module compiled ahead,
or numba and its cache) before its first byte of weights is read, beside a second, warm load in the
same process.

    python -m tpload synth /tmp/medium --preset medium
    python launch/first-call.py /tmp/medium [--repeats 3] [--nproc 2] [--tree OLD] [key=value ...]

Each repeat starts fresh processes (torchrun, ``--nproc`` ranks, tp = nproc) that ``import torch``
and make their gloo group (a serving process has both already), then start the clock together,
load twice and release. Per rank:

* ``to_first_read``: from just after ``import torch`` to the first weight byte read (numba's
  import and kernel load included when they happen before it); ``to_first_read_second``: the
  second load's, from its call (per-load work such as the arena's allocation is in both);
* ``first_load`` / ``second_load``: each load's wall seconds; their difference is the
  once-per-process work wherever it falls (after the first read too);
* ``numba_at_first_read``: whether numba was imported by the first read;
* ``kernels``: which kernels the loads ran (``ahead`` or ``numba``);
* ``report_first_call``: the report's own figure (``first_call_seconds``), when it has one.

The page cache is warmed by a load before the repeats, so storage speed is not what is measured.
``key=value`` options are ``tpload.load``'s keywords (a value that reads as JSON is taken as such:
``tp=2``). The measure itself is tpload/tools/first_call.py, which the bench also runs once after
its rounds (``python -m tpload bench``: its ``first call:`` line). It measures this checkout's
tpload, or with ``--tree OLD`` another checkout's (before and after: the measure is this
checkout's, the loads are OLD's).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tpload
from tpload.tools.first_call import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

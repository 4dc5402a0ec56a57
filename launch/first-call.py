"""A process's first load: what it pays once (imports, the kernels' load) before its first byte of
weights is read, beside a second, warm load in the same process.

    python -m tpload synth /tmp/medium --preset medium
    python launch/first-call.py /tmp/medium [--repeats 3] [--nproc 2] [--tree OLD] [key=value ...]

``key=value`` options are ``tpload.load``'s keywords (a value that reads as JSON is taken as such:
``tp=2``); ``--tree OLD`` measures another checkout's tpload (before and after). What each figure
means, and how the processes are started: tpload/tools/first_call.py, the measure itself, which the
bench also runs once after its rounds (``python -m tpload bench``: its ``first call:`` line).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tpload
from tpload.tools.first_call import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

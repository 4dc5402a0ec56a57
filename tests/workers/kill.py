"""Run under torchrun: load, with rank KILL_RANK killing itself (SIGKILL) after N tensors.

argv: CHECKPOINT KILL_RANK N [verify]. The others must stop with a message naming the dead rank,
never hang; the killed rank prints nothing.
"""

from __future__ import annotations

import os
import signal
import sys

import tpload


class KillAfter:
    """A progress sink that kills this process after ``n`` tensors (what the OOM killer does)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def update(self, nbytes: int) -> None:
        self.left -= 1
        if self.left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        pass


def main() -> None:
    ckpt, victim, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    verify = sys.argv[4] if len(sys.argv) > 4 else "node"
    sink = KillAfter(n) if int(os.environ["RANK"]) == victim else None
    if sink is None:
        # torchrun SIGTERMs the survivors once the victim is gone; whether that comes before they
        # reach the exchange is a race on a loaded machine. What is tested is the exchange's
        # verdict, so the survivors wait for it (torchrun's SIGKILL after its grace period still
        # bounds them).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        tpload.load(ckpt, progress=False, verify=verify, timeout_s=60.0, progress_sink=sink)
    except tpload.LoadError as e:
        print(f"[rank {os.environ['RANK']}] tpload: error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

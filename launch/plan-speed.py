"""Seconds to plan the 64 rank plans of full-size DeepSeek-V3 (tp 8 x ep 8), after imports.

    python launch/plan-speed.py [DIR] [--repeats 3]

Writes a headers-only ``deepseek-v3-full`` checkpoint into DIR (default: a temporary folder) with
``python -m tpload synth``, then, in this process, times planning: choosing the config, reading
config.json, classifying the catalogue and cutting every rank's plan (``Planner(...).plan`` for all
64 ranks), wall and CPU seconds; opening the catalogue before it (storage's) is shown apart. Each
repeat starts from a fresh catalogue. Prints one line per repeat and the best.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", nargs="?", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--kind", default="packed")
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="plan-speed-"))
    if not (root / "model.safetensors.index.json").exists():
        subprocess.run(
            [sys.executable, "-m", "tpload", "synth", str(root), "--preset", "deepseek-v3-full"]
            + ["--headers-only"],
            check=True,
        )
    try:
        from tpload.loading.pick import choose
        from tpload.loading.planner import planner_of
        from tpload.model.values import Layout
        from tpload.storage.open import open_storage
    except ImportError:  # a tree from before the tools' face (issue 29)
        try:
            from tpload.loading.planner import planner_of
            from tpload.planning.layout import Layout
            from tpload.selection.pick import choose
            from tpload.storage.open import open_storage
        except ImportError:  # before the packages: the planner read config.json itself
            from tpload.pick import choose
            from tpload.plan import Layout
            from tpload.plan import Planner as planner_of
            from tpload.storage import open_storage
    layout = Layout(args.tp, args.ep)
    best = float("inf")
    for k in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        storage = open_storage(root, tp=layout.tp, ep=layout.ep, rank=0, world=layout.world)
        t1, c1 = time.perf_counter(), time.process_time()
        config, _ = choose("auto", storage.root, pins=storage.catalogue.pins)
        planner = planner_of(storage.catalogue, config)
        planner.check_layout(layout, layout.world)
        t2 = time.perf_counter()
        plans = [planner.plan(layout, args.kind, r) for r in range(layout.world)]
        t3, c3 = time.perf_counter(), time.process_time()
        storage.close()
        best = min(best, t3 - t1)
        print(
            f"repeat {k + 1}: planning {t3 - t1:.3f} s wall, {c3 - c1:.3f} s CPU (classify "
            f"{t2 - t1:.3f}, {len(plans)} plans {t3 - t2:.3f}; {sum(q.served for q in plans):,} "
            f"served tensors); opening the catalogue before it {t1 - t0:.3f} s wall, "
            f"{c1 - c0:.3f} s CPU"
        )
    print(f"best {best:.3f} s wall to plan {layout.world} ranks of {root}")


if __name__ == "__main__":
    main()

"""Seconds one rank spends on the replicas' split before any read: full-size DeepSeek-V3, R replicas
x tp T (default 8 x 8).

    python launch/replica-split-speed.py [DIR] [--replicas 8] [--tp 8] [--repeats 3]

Writes a headers-only ``deepseek-v3-full`` checkpoint into DIR (default: a temporary folder) with
``python -m tpload synth``, plans every position (not timed: the load has its plans), then times
what ``sources.open.open_source()`` does with them in a fresh process per repeat: every position's
runs, their split, this rank's maps (position 0) and every position's reads (a node of T ranks asks
for all).
Run it against an older tree (PYTHONPATH) to compare: a tree from before replica_split.py makes
every position's named items and splits runs of names (``replicas.split``, ``replicas.load_runs``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def once(root: Path, tp: int, replicas: int) -> float:
    try:
        from tpload.loading.pick import choose, model_for
        from tpload.model.values import Layout
        from tpload.planning.planner import Planner
        from tpload.selection.config import with_rules
        from tpload.storage.open import open_storage
    except ImportError:  # a tree from before the tools' face (issue 29)
        try:
            from tpload.planning.layout import Layout
            from tpload.planning.planner import Planner
            from tpload.selection.config import with_rules
            from tpload.selection.pick import choose, model_for
            from tpload.storage.open import open_storage
        except ImportError:  # before the packages
            from tpload.config import with_rules
            from tpload.pick import choose, model_for
            from tpload.plan import Layout, Planner
            from tpload.storage import open_storage

    layout = Layout(tp, 1)
    storage = open_storage(root, tp=tp, ep=1, rank=0, world=tp)
    config, _ = choose("auto", storage.root, pins=storage.catalogue.pins)
    planner = Planner(storage.catalogue, with_rules(config), model=model_for(storage.root, config))
    plans = [planner.plan(layout, "packed", p) for p in range(tp)]
    t0 = time.perf_counter()
    try:  # what this script times: the replicas' split itself, an internal of distributed/
        from tpload.distributed.replica_split import Names, split_runs
    except ImportError:  # a tree from before the packages (issue 29), or before replica_split.py
        try:
            from tpload.replica_split import Names, split_runs
        except ImportError:
            from tpload.replicas import load_runs, split

            got = split([load_runs(p, storage) for p in plans], replicas)
            Names = None
    if Names is not None:
        names = Names(plans[0].all_entries)
        got = split_runs([names.runs(p, storage) for p in plans], replicas, names.names)
    _ = got[0].by_name, got[0].by_batch, [p.reads for p in got]
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", nargs="?", default=None)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="split-speed-"))
    if args.once:
        print(f"{once(root, args.tp, args.replicas):.3f}")
        return
    if not (root / "model.safetensors.index.json").exists():
        subprocess.run(
            [sys.executable, "-m", "tpload", "synth", str(root), "--preset", "deepseek-v3-full"]
            + ["--headers-only"],
            check=True,
        )
    argv = [sys.executable, __file__, str(root), "--tp", str(args.tp), "--once"]
    argv += ["--replicas", str(args.replicas)]
    seconds = []
    for k in range(args.repeats):  # a fresh process each: the plans' items are cached in one
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        seconds.append(float(out.split()[-1]))
        print(f"repeat {k + 1}: {seconds[-1]:.2f} s")
    best = min(seconds)
    print(f"{args.replicas} replicas x tp {args.tp}: the split costs a rank {best:.2f} s (best)")


if __name__ == "__main__":
    main()

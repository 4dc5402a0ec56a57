"""The load's own seconds per rank on checkpoints of many tensors, alternating two code trees: the
per-tensor slope, the full-depth miniature, and each rank's peak RSS.

    python launch/per-tensor-cost.py DIR [DIR ...] [--repeats 3] [--nproc 2] [--old TREE]
        [--via cli,api] [--args "--verify node"]

Each DIR is a written checkpoint (``python -m tpload synth DIR --preset many-tensors --tensors
5000``, ``--tensors 25000``, ``--preset deepseek-v3-deep``). Every round runs, for each tree (this
one, then ``--old`` when given: a checkout of another commit, run with PYTHONPATH pointing at it),
each checkpoint, each way in:

- ``cli``: ``torchrun --standalone --nproc-per-node N -m tpload DIR --no-progress --report R`` (the
  command line, which owns its process);
- ``api``: the same ranks calling ``tpload.load(DIR, progress=False)`` from a script that sets no
  collector policy, as a serving engine's worker does.

A run's figure is its slowest rank's ``seconds`` (the load's own clock: after the process started
and tpload was imported, to the verdict) and the largest peak RSS. Rounds alternate the trees, so
both see the same machine. Prints each run, then the median per tree, checkpoint and way, and the
slope between each pair of checkpoints (the first and second, the third and fourth, ...:
microseconds per tensor per rank, from the medians).

    python -m tpload synth /tmp/a5k --preset many-tensors-alternating --tensors 5000
    python launch/per-tensor-cost.py /tmp/m5k /tmp/m25k /tmp/a5k /tmp/a25k --via cli

puts the same tensors dealt to two files in turn (natural order alternating between the files at
every tensor) beside those stored file by file: two slopes under one machine's noise, and the
second pair's against the first (``ratio ... pair 2 against pair 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
API = """
import json, os, sys
import tpload
shards = tpload.load(sys.argv[1], progress=False, **json.loads(sys.argv[2]))
if int(os.environ["RANK"]) == 0:
    print("REPORT " + json.dumps(shards.report.to_dict()))
"""


def run(tree: Path, ckpt: str, via: str, nproc: int, extra: list[str]) -> tuple[float, float, int]:
    """(the slowest rank's seconds, the largest peak RSS in GiB, the tensors a rank serves)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", str(nproc)]
    with tempfile.TemporaryDirectory() as tmp:
        if via == "cli":
            report = Path(tmp) / "r.json"
            cmd = torchrun + ["-m", "tpload", ckpt, "--no-progress", "--report", str(report)]
            subprocess.run(cmd + extra, check=True, env=env, capture_output=True, cwd=tmp)
            doc = json.loads(report.read_text())
        else:
            script = Path(tmp) / "api_load.py"
            script.write_text(API)
            options = _options(extra)
            out = subprocess.run(
                torchrun + [str(script), ckpt, json.dumps(options)],
                check=True,
                env=env,
                capture_output=True,
                text=True,
                cwd=tmp,
            ).stdout
            doc = json.loads(next(x for x in out.splitlines() if x.startswith("REPORT "))[7:])
    ranks = doc["ranks"]
    seconds = max(r["ns"] for r in ranks) / 1e9
    rss = max(r["rss_peak"] or 0 for r in ranks) / 2**30
    return seconds, rss, ranks[0]["tensors"]


def _options(extra: list[str]) -> dict[str, object]:
    """``--verify node`` and the like as load() keywords."""
    out: dict[str, object] = {}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        out[flag.removeprefix("--").replace("-", "_")] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dirs", nargs="+")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--old", default=None, help="another checkout to alternate with")
    p.add_argument("--via", default="cli,api")
    p.add_argument("--args", default="", help="extra load flags, e.g. '--verify node'")
    args = p.parse_args()
    trees = {"this": HERE.parent} | ({"old": Path(args.old).resolve()} if args.old else {})
    ways, extra = args.via.split(","), args.args.split()
    got: dict[tuple[str, str, str], list[float]] = {}
    tensors: dict[str, int] = {}
    for k in range(args.repeats):
        order = list(trees.items()) if k % 2 == 0 else list(reversed(trees.items()))
        for name, tree in order:
            for ckpt in args.dirs:
                for via in ways:
                    s, rss, n = run(tree, ckpt, via, args.nproc, extra)
                    tensors[ckpt] = n
                    got.setdefault((name, ckpt, via), []).append(s)
                    print(
                        f"round {k + 1} {name:4} {via:3} {Path(ckpt).name:>10}: {s:7.3f} s, "
                        f"peak RSS {rss:.2f} GiB, {n:,} tensors a rank",
                        flush=True,
                    )
    print()
    for (name, ckpt, via), values in got.items():
        print(
            f"median {name:4} {via:3} {Path(ckpt).name:>10}: {statistics.median(values):7.3f} s "
            f"of {', '.join(f'{v:.3f}' for v in values)}"
        )
    slopes: dict[tuple[str, str], list[float]] = {}
    for a, b in zip(args.dirs[::2], args.dirs[1::2], strict=False):
        for name in trees:
            for via in ways:
                ma = statistics.median(got[(name, a, via)])
                mb = statistics.median(got[(name, b, via)])
                slope = (mb - ma) / (tensors[b] - tensors[a]) * 1e6
                slopes.setdefault((name, via), []).append(slope)
                print(
                    f"slope  {name:4} {via:3} {Path(a).name}..{Path(b).name}: {slope:.1f} us per "
                    "tensor per rank"
                )
    # each later pair against the first (the alternating layout against file by file, say)
    for (name, via), each in slopes.items():
        for k, later in enumerate(each[1:], start=2):
            print(f"ratio  {name:4} {via:3} pair {k} against pair 1: {later / each[0]:.2f}x")


if __name__ == "__main__":
    main()

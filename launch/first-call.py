"""A process's first load: what it pays once (imports, the kernels' load from numba's cache) before
its first byte of weights is read, beside a second, warm load in the same process.

    python -m tpload synth /tmp/medium --preset medium
    python launch/first-call.py /tmp/medium [--repeats 3] [--nproc 2] [key=value ...]

Each repeat starts fresh processes (torchrun, ``--nproc`` ranks, tp = nproc) that ``import torch``
and make their gloo group (a serving process has both already), then start the clock together,
load twice and release. Per rank:

* ``to_first_read``: from just after ``import torch`` to the first weight byte read (numba's
  import and kernel load included when they happen before it); ``to_first_read_second``: the
  second load's, from its call (per-load work such as the arena's allocation is in both);
* ``first_load`` / ``second_load``: each load's wall seconds; their difference is the
  once-per-process work wherever it falls (after the first read too);
* ``numba_at_first_read``: whether numba was imported by the first read;
* ``report_first_call``: the report's own figure (``first_call_seconds``), when it has one.

The page cache is warmed by a load before the repeats, so storage speed is not what is measured.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(ckpt: str, out: str, options: dict[str, str]) -> None:
    import torch.distributed as dist  # a serving process has torch, and its group, already

    dist.init_process_group("gloo")
    dist.barrier()  # every rank starts the clock together
    start = time.perf_counter_ns()
    from tpload.storage import files  # its import is inside the span: the spy needs the class

    first: list[int] = []
    numba_then: list[bool] = []
    read_into = files.Shard.read_into

    def spy(self: files.Shard, *args: object, **kwargs: object) -> None:
        if not first:
            first.append(time.perf_counter_ns())
            numba_then.append("numba" in sys.modules)
        read_into(self, *args, **kwargs)

    files.Shard.read_into = spy  # type: ignore[method-assign]
    import tpload

    walls, reports, reads = [], [], []
    for _ in range(2):
        t = time.perf_counter_ns()
        first.clear()
        shards = tpload.load(ckpt, progress=False, **options)
        reads.append((first[0] - (start if not reads else t)) / 1e9)
        walls.append((time.perf_counter_ns() - t) / 1e9)
        reports.append(json.loads(shards.report.to_json()))
        shards.release()
    rank = dist.get_rank()
    dist.destroy_process_group()
    mine = reports[0]
    figure = _find(mine, "first_call_seconds", rank)
    Path(f"{out}.{rank}").write_text(
        json.dumps(
            {
                "rank": rank,
                "to_first_read": reads[0],
                "to_first_read_second": reads[1],
                "first_load": walls[0],
                "second_load": walls[1],
                "numba_at_first_read": numba_then[0],  # its import begun, at least
                "report_first_call": figure,
                "report_first_call_second": _find(reports[1], "first_call_seconds", rank),
            }
        )
    )


def _find(report: dict, key: str, rank: int) -> object:
    """``key`` of rank ``rank`` in the report's JSON (per-rank rows), or None."""
    for row in report.get("ranks", []):
        if row.get("rank") == rank and key in row:
            return row[key]
    return report.get(key)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ckpt: str, nproc: int, options: list[str], out: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={_free_port()}",
        __file__,
        "--worker",
        ckpt,
        out,
        *options,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        sys.exit(
            f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def _compile(env: dict[str, str]) -> None:
    """Byte-compile the tpload being measured, as an install does: without .pyc files (as under
    PYTHONDONTWRITEBYTECODE) every process compiles every module again, a cost no install pays."""
    where = subprocess.run(
        [sys.executable, "-c", "import os, tpload; print(os.path.dirname(tpload.__file__))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    ).stdout.strip()
    subprocess.run([sys.executable, "-m", "compileall", "-q", where], check=True)
    print(f"# measuring {where}", flush=True)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--worker":
        options = dict(a.split("=", 1) for a in args[3:])
        worker(args[1], args[2], options)
        return
    repeats, nproc, rest = 3, 2, []
    it = iter(args)
    for a in it:
        if a == "--repeats":
            repeats = int(next(it))
        elif a == "--nproc":
            nproc = int(next(it))
        else:
            rest.append(a)
    if not rest:
        sys.exit(__doc__)
    ckpt, options = rest[0], rest[1:]
    _compile(dict(os.environ))
    with tempfile.TemporaryDirectory() as tmp:
        run(ckpt, nproc, options, f"{tmp}/warm")  # the page cache, not storage, is what follows
        rows = []
        for i in range(repeats):
            out = f"{tmp}/r{i}"
            t = time.perf_counter()
            run(ckpt, nproc, options, out)
            for r in range(nproc):
                row = json.loads(Path(f"{out}.{r}").read_text())
                row["repeat"] = i
                rows.append(row)
                print(json.dumps(row), flush=True)
            print(f"# repeat {i}: {time.perf_counter() - t:.1f} s with torchrun", flush=True)
    keys = ("to_first_read", "to_first_read_second", "first_load", "second_load")
    for key in (*keys, "report_first_call"):
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        if values:
            print(
                f"{key}: median {statistics.median(values):.3f} s "
                f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} rank-runs)"
            )
    once = [r["first_load"] - r["second_load"] for r in rows]
    print(f"first_load - second_load: median {statistics.median(once):.3f} s")


if __name__ == "__main__":
    main()

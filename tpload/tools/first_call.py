"""A process's first load: what it pays once (imports, the kernels' load) before its first byte of
weights is read, beside a second, warm load in the same process. The bench prints it after its
rounds (``python -m tpload bench``); ``launch/first-call.py`` runs it alone, with repeats.

Each repeat starts fresh processes (torchrun, ``nproc`` ranks) that ``import torch`` and make their
process group (gloo; NCCL beside it with CUDA: a serving process has both already), then start the
clock together, load twice and release. Per rank:

* ``to_first_read``: from just after ``import torch`` to the first weight byte read (numba's
  import and kernel load included when they happen before it); ``to_first_read_second``: the
  second load's, from its call (per-load work such as the arena's allocation is in both);
* ``first_load`` / ``second_load``: each load's wall seconds; their difference is the
  once-per-process work wherever it falls (after the first read too); ``before_first_load``: from
  the clock's start to the first load's call (tpload's own imports before it: ``to_first_read``
  is never more than this and ``first_load`` together);
* ``numba_at_first_read``: whether numba was imported by the first read;
* ``kernels``: which kernels the loads ran ("ahead": compiled ahead, no numba; "numba");
* ``report_first_call``: the report's own figure (``first_call_seconds``), when it has one.

The worker runs as a file, not a module (``-m`` would import the tpload package before the clock):
this module imports nothing of tpload at its top, and its worker imports tpload only inside the
span it times. The page cache is warm, so storage speed is not what is measured.
"""

from __future__ import annotations

import argparse
import compileall
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any  # JSON rows and figures

HERE = Path(__file__).resolve().parent

FIGURES = (
    "to_first_read",
    "to_first_read_second",
    "before_first_load",
    "first_load",
    "second_load",
    "report_first_call",
)
"""The per-rank seconds a run gives, in the order they are printed (and ``once`` after them)."""


# -- the worker (one rank of a torchrun job) -----------------------------------------------------


def worker(ckpt: str, out: str, options: Mapping[str, Any]) -> None:
    """Load ``ckpt`` twice with ``options`` (``tpload.load``'s keywords) and write this rank's
    figures to ``{out}.{rank}`` (JSON)."""
    import torch
    import torch.distributed as dist  # a serving process has torch, and its group, already

    # the group a serving process (and tpload's own init_world) makes: NCCL beside gloo on a GPU
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    dist.barrier()  # every rank starts the clock together
    start = time.perf_counter_ns()
    from tpload.storage import files  # its import is inside the span: the spy needs the class

    first: list[int] = []
    numba_then: list[bool] = []
    read_into = files.Shard.read_into

    def spy(self: files.Shard, *args: Any, **kwargs: Any) -> None:
        if not first:
            first.append(time.perf_counter_ns())
            numba_then.append("numba" in sys.modules)
        read_into(self, *args, **kwargs)

    files.Shard.read_into = spy  # type: ignore[method-assign]
    import tpload

    walls: list[float] = []
    reads: list[float] = []
    reports: list[dict[str, Any]] = []
    called = time.perf_counter_ns()  # the first load's call: what comes before it is imports
    for _ in range(2):
        t = time.perf_counter_ns()
        first.clear()
        shards = tpload.load(ckpt, progress=False, **options)
        reads.append((first[0] - (start if not reads else t)) / 1e9)
        walls.append((time.perf_counter_ns() - t) / 1e9)
        reports.append(json.loads(shards.report.to_json()))
        shards.release()
    # After the clocks: the loads warmed the kernels (kernels/lazy.py), so asking loads nothing.
    try:
        from tpload.kernels.lazy import kernels

        implementation = getattr(kernels, "implementation", None)
    except ImportError:  # an older checkout (--tree), before the kernels were lazy
        implementation = None
    rank = dist.get_rank()
    dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(
        json.dumps(
            {
                "rank": rank,
                "to_first_read": reads[0],
                "to_first_read_second": reads[1],
                "before_first_load": (called - start) / 1e9,
                "first_load": walls[0],
                "second_load": walls[1],
                "numba_at_first_read": numba_then[0],  # its import begun, at least
                "kernels": implementation,
                "report_first_call": report_figure(reports[0], "first_call_seconds", rank),
                "report_first_call_second": report_figure(reports[1], "first_call_seconds", rank),
            }
        )
    )


def report_figure(report: Mapping[str, Any], key: str, rank: int) -> Any:
    """``key`` of rank ``rank`` in the report's JSON (per-rank rows), or the report's own, or
    None."""
    for row in report.get("ranks", []):
        if row.get("rank") == rank and key in row:
            return row[key]
    return report.get(key)


# -- the driver: fresh processes, repeated -------------------------------------------------------


class FirstCallFailed(RuntimeError):
    """A torchrun job of the measure failed or timed out (the message says how)."""


def run_job(
    ckpt: str,
    *,
    nproc: int,
    options: Mapping[str, Any],
    out: str,
    timeout_s: float,
    tree: Path | None = None,
) -> None:
    """One torchrun job of ``nproc`` fresh workers; each writes ``{out}.{rank}``. ``tree``: the
    checkout whose tpload the workers load (default: this one)."""
    from .bench_job import worker_env

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(HERE / "first_call.py"),  # a file: see the module's doc
        "--worker",
        ckpt,
        out,
        json.dumps(dict(options)),
    ]
    # the tpload of this checkout (worker_env), one thread a rank, torchrun's own lines quiet
    env = dict(worker_env(nproc), OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env["PYTHONPATH"]])
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise FirstCallFailed(f"torchrun timed out after {timeout_s:.0f} s") from e
    if done.returncode:
        raise FirstCallFailed(
            f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def compile_package(tree: Path | None = None) -> Path:
    """Byte-compile the tpload being measured (``tree``'s, default this checkout's), as an install
    does: without .pyc files (as under PYTHONDONTWRITEBYTECODE) every process compiles every module
    again, a cost no install pays. Returns its folder."""
    package = HERE.parent if tree is None else tree / "tpload"
    compileall.compile_dir(str(package), quiet=1)
    return package


def measure(
    ckpt: str,
    *,
    nproc: int,
    repeats: int = 1,
    options: Mapping[str, Any] | None = None,
    warm_run: bool = True,
    timeout_s: float = 900.0,
    tree: Path | None = None,
    log: Callable[[str], object] = print,
) -> list[dict[str, Any]]:
    """Every rank's figures of ``repeats`` torchrun jobs (each row with its ``repeat``), after one
    unmeasured job when ``warm_run`` (the page cache, not storage, is what follows; a caller that
    knows the cache is warm passes False); ``tree``: another checkout's tpload to measure (an
    older one: before and after). Raises FirstCallFailed."""
    compile_package(tree)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpload-first-call-") as tmp:
        job = functools.partial(
            run_job, ckpt, nproc=nproc, options=options or {}, timeout_s=timeout_s, tree=tree
        )
        if warm_run:
            job(out=f"{tmp}/warm")
        for i in range(repeats):
            out = f"{tmp}/r{i}"
            t = time.perf_counter()
            job(out=out)
            for r in range(nproc):
                rows.append({**_row(Path(f"{out}.{r}")), "repeat": i})
            log(f"first call, repeat {i}: {time.perf_counter() - t:.1f} s with torchrun")
    return rows


def _row(path: Path) -> dict[str, Any]:
    """A rank's row, as its worker wrote it (through the bounded reader, as every file is read).
    The driver's alone: this file's worker runs as a file, with no tpload imported at its top."""
    from ..model.errors import CheckpointError
    from ..storage.files import read_json

    try:
        got = read_json(path, "a first-call row")
    except CheckpointError as e:
        raise FirstCallFailed(str(e)) from None
    if not isinstance(got, dict):
        raise FirstCallFailed(f"{path}: expected a JSON object, got {type(got).__name__}")
    return got


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each figure (:data:`FIGURES`, and ``once``: first load minus second) over the rows: median,
    min and max over every rank-run, and ``slowest``: the median over repeats of each repeat's
    slowest rank (a load is as late as its last rank). A figure no row has is left out. Also how
    many rank-runs had numba imported by their first read, and which kernels ran."""
    figures: dict[str, Any] = {}
    for key in (*FIGURES, "once"):
        by_repeat: dict[int, list[float]] = {}
        for row in rows:
            value = row["first_load"] - row["second_load"] if key == "once" else row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                by_repeat.setdefault(row.get("repeat", 0), []).append(float(value))
        values = [v for vs in by_repeat.values() for v in vs]
        if values:
            figures[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "rank_runs": len(values),
                "slowest": statistics.median(max(vs) for vs in by_repeat.values()),
            }
    return {
        "repeats": len({row.get("repeat", 0) for row in rows}),
        "rank_runs": len(rows),
        "figures": figures,
        "numba_at_first_read": sum(bool(row.get("numba_at_first_read")) for row in rows),
        "kernels": sorted({str(row.get("kernels")) for row in rows}),
    }


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The launch script's lines: each figure's median over rank-runs with min and max."""
    lines = []
    for key, f in summary["figures"].items():
        if key == "once":
            lines.append(f"first_load - second_load: median {f['median']:.3f} s")
        else:
            lines.append(
                f"{key}: median {f['median']:.3f} s (min {f['min']:.3f}, max {f['max']:.3f}, "
                f"{f['rank_runs']} rank-runs; slowest rank {f['slowest']:.3f})"
            )
    lines.append(f"numba imported by the first read: {numba_words(summary)}")
    lines.append(f"kernels: {', '.join(summary['kernels'])}")
    return lines


def numba_words(summary: Mapping[str, Any]) -> str:
    """Whether numba was imported by the first read: no, yes, or on how many rank-runs."""
    n, of = summary["numba_at_first_read"], summary["rank_runs"]
    return "no" if n == 0 else "yes" if n == of else f"on {n} of {of} rank-runs"


def bench_line(summary: Mapping[str, Any]) -> str:
    """The bench's one line: the slowest rank's figures."""
    f = summary["figures"]
    report = f.get("report_first_call")
    return (
        f"first call: {f['to_first_read']['slowest']:.2f} s beyond import torch to the first "
        f"weight byte (slowest rank; second load {f['to_first_read_second']['slowest']:.2f} s"
        + (f"; the report's first_call_seconds {report['slowest']:.2f} s" if report else "")
        + f"; numba imported: {numba_words(summary)}; kernels: {', '.join(summary['kernels'])})"
    )


# -- the launch script's command line ------------------------------------------------------------


def option_value(text: str) -> Any:
    """A ``key=value`` option's value: JSON where it reads as JSON (``tp=2``, ``progress=false``),
    else the text itself (``verify=node``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """``launch/first-call.py``'s command line: measure, print every rank-run's row and the
    figures."""
    p = argparse.ArgumentParser(
        prog="python launch/first-call.py",
        description="A process's first load beside a second one (imports included), in fresh "
        "torchrun processes; each repeat's rows, then medians.",
    )
    p.add_argument("checkpoint")
    p.add_argument("options", nargs="*", metavar="key=value", help="tpload.load's keywords")
    p.add_argument("--repeats", type=int, default=3, help="fresh torchrun jobs (default 3)")
    p.add_argument("--nproc", type=int, default=2, help="ranks a job (default 2)")
    p.add_argument(
        "--tree",
        type=Path,
        metavar="DIR",
        help="the checkout whose tpload to measure (an older one, for before and after; default: "
        "this script's)",
    )
    args = p.parse_intermixed_args(argv)  # options after the flags too, as before
    if args.repeats < 1 or args.nproc < 1:
        p.error("--repeats and --nproc must be at least 1")
    if any("=" not in o for o in args.options):
        p.error("options are key=value")
    options = {k: option_value(v) for k, v in (o.split("=", 1) for o in args.options)}
    tree = args.tree.resolve() if args.tree else None
    if tree is not None and not (tree / "tpload" / "__init__.py").is_file():
        p.error(f"--tree {args.tree}: no tpload package there")
    print(f"# measuring {HERE.parent if tree is None else tree / 'tpload'}", flush=True)
    try:
        rows = measure(
            args.checkpoint,
            nproc=args.nproc,
            repeats=args.repeats,
            options=options,
            tree=tree,
            log=lambda s: print(f"# {s}", flush=True),
        )
    except FirstCallFailed as e:
        sys.exit(str(e))
    for row in rows:
        print(json.dumps(row))
    print("\n".join(summary_lines(summarize(rows))))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # a rank of run_job's torchrun job, run as a file
        # Python put this folder first on sys.path, where the tools' modules would stand for
        # top-level names; tpload comes from PYTHONPATH (worker_env pins this checkout).
        if sys.path and Path(sys.path[0]).resolve() == HERE:
            sys.path.pop(0)
        worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        sys.exit(main())

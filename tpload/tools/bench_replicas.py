"""``python -m tpload bench --replicas R``: R replicas of one tp plan in one launch, sharing the
reads (each window read from storage once per cluster: sources/replicas.py), against the R replicas
each reading alone (R launches of tp ranks at once, as R nodes would), alternating round by round.

Both arms are the command line's own load (``torchrun -m tpload DIR --tp T [--replicas R]``) with
its JSON report; the figures come from the reports (bytes counted as read and as received) and from
the launch's wall clock. A load without replicas does not count its storage reads (its report has
the plan's window bytes; a batch of small tensors reads their whole span): a replica alone reads
every run its position's ranks shared, the same spans, so the alone arm's storage bytes are the
shared arm's bytes from storage plus from peers (R x one replica's reads), said so in the table.
Before any figure is printed, every rank's digest must equal the digest of the rank at its position
reading alone: an arm that served other bytes is refused, not measured.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any  # JSON rows and figures

from ..model.bounds import COUNT, RANKS, SECONDS
from ..options.flags import Parser
from ..selection.defaults import DEFAULT_CONFIG
from ..storage.files import atomic_write, read_json
from .bench import preset_checkpoint
from .bench_job import worker_env
from .synth import PRESETS

GIB = 1 << 30


@dataclass(frozen=True)
class ReplicaBench:
    """What one replicas bench measures."""

    checkpoint: str
    replicas: int = 2
    tp: int = 2
    rounds: int = 3
    config: str = DEFAULT_CONFIG
    timeout_s: float = 1800.0
    digest_store: str = ""
    """The bench's own store (a load compares with any prediction it finds in the operator's)."""


def _command(b: ReplicaBench, nproc: int, report: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "-m",
        "tpload",
        b.checkpoint,
        "--tp",
        str(b.tp),
        "--config",
        b.config,
        "--no-progress",
        "--digest-store",
        b.digest_store,
        "--report",
        str(report),
        *extra,
    ]


def _launch(b: ReplicaBench, runs: list[tuple[int, Path, tuple[str, ...]]]) -> dict[str, Any] | str:
    """Start every launch at once; wait for all. Every rank's report row (launch by launch) and the
    wall time until the last one ended, or the first failure's last lines."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            _command(b, n, report, *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=worker_env(n * len(runs)),
        )
        for n, report, extra in runs
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=b.timeout_s)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return f"timed out after {b.timeout_s:.0f} s"
    wall = time.perf_counter() - t0
    for p, out in zip(procs, outs, strict=True):
        if p.returncode != 0:
            return f"exit {p.returncode}: " + " | ".join(out.strip().splitlines()[-3:])
    reports: list[Any] = [read_json(report, "load report") for _, report, _ in runs]  # JSON
    ranks = [r for doc in reports for r in doc["ranks"]]
    return {"wall": wall, "ranks": ranks}


def shared(b: ReplicaBench, tmp: Path) -> dict[str, Any] | str:
    """One launch of R x tp ranks with ``--replicas R``."""
    nproc = b.replicas * b.tp
    return _launch(b, [(nproc, tmp / "shared.json", ("--replicas", str(b.replicas)))])


def alone(b: ReplicaBench, tmp: Path) -> dict[str, Any] | str:
    """R launches of tp ranks at once, each replica reading everything it serves."""
    return _launch(b, [(b.tp, tmp / f"alone{q}.json", ()) for q in range(b.replicas)])


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: storage bytes as counted (a rank reading alone reads all its windows)."""
    ranks = run["ranks"]
    counted = all(r.get("bytes_from_storage") is not None for r in ranks)
    return {
        "wall_s": run["wall"],
        "load_s": max(r["ns"] for r in ranks) / 1e9,
        "storage_bytes": sum(r["bytes_from_storage"] for r in ranks) if counted else None,
        "window_bytes": sum(r["bytes_read"] for r in ranks),
        "peer_bytes": sum(r.get("bytes_from_peers") or 0 for r in ranks),
        "hashed_bytes": sum(r["bytes_hashed"] for r in ranks),
        "rss_peak": max(r["rss_peak"] for r in ranks),
        "anon_peak": max(r["anon_peak"] for r in ranks),
        "digests": [r["digest"] for r in ranks],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds, with the wall time's min-max; the byte counts must not vary."""
    out = {k: statistics.median(f[k] for f in runs) for k in ("wall_s", "load_s")}
    out.update(
        wall_min=min(f["wall_s"] for f in runs),
        wall_max=max(f["wall_s"] for f in runs),
        storage_bytes=runs[0]["storage_bytes"],
        peer_bytes=runs[0]["peer_bytes"],
        window_bytes=runs[0]["window_bytes"],
        hashed_bytes=runs[0]["hashed_bytes"],
        rss_peak=statistics.median(f["rss_peak"] for f in runs),
        anon_peak=statistics.median(f["anon_peak"] for f in runs),
        rounds=len(runs),
    )
    return out


def run_bench(b: ReplicaBench, log: Callable[[str], object] = print) -> dict[str, Any]:
    """Every round of both arms (shared, alone; then alone, shared...). Returns the summaries and,
    under ``refused``, why an arm shows no figures."""
    arms = {"shared": shared, "alone": alone}
    got: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="tpload-bench-replicas-") as tmp:
        for k in range(b.rounds):
            for arm in list(arms) if k % 2 == 0 else list(reversed(arms)):
                run = arms[arm](b, Path(tmp))
                if isinstance(run, str):
                    return {"refused": f"{arm}: round {k + 1} failed: {run}"}
                got[arm].append(figures(run))
                log(f"round {k + 1}: {arm}: {run['wall']:.1f} s with launch")
    want = got["alone"][0]["digests"]  # launch by launch: positions 0..tp-1, R times
    for arm, runs in got.items():
        for k, f in enumerate(runs):
            if f["digests"] != want:
                return {"refused": f"{arm}: round {k + 1} served other bytes than a replica alone"}
            if f["storage_bytes"] != runs[0]["storage_bytes"]:
                return {"refused": f"{arm}: storage bytes differ between rounds"}
    out = {arm: summarize(runs) for arm, runs in got.items()}
    s = out["shared"]
    out["alone"]["storage_bytes"] = s["storage_bytes"] + s["peer_bytes"]  # see the module doc
    return out


def table(b: ReplicaBench, res: dict[str, Any]) -> str:
    s, a = res["shared"], res["alone"]
    lines = [
        f"bench --replicas {b.replicas}: {b.checkpoint}, tp {b.tp}, {s['rounds']} round(s), "
        f"{b.replicas * b.tp} processes each arm; seconds: median [min-max], wall with torchrun",
        f"{'arm':<28} {'wall s':>20} {'load s':>7} {'storage GB':>11} {'peers GB':>9} "
        f"{'hashed GB':>10} {'peak RSS/anon GiB a rank':>25}",
    ]
    for name, f in (
        (f"{b.replicas} replicas x tp {b.tp}", s),
        (f"{b.replicas} x (tp {b.tp} alone)", a),
    ):
        wall = f"{f['wall_s']:.1f} [{f['wall_min']:.1f}-{f['wall_max']:.1f}]"
        mem = f"{f['rss_peak'] / GIB:.2f}/{f['anon_peak'] / GIB:.2f}"
        lines.append(
            f"{name:<28} {wall:>20} {f['load_s']:>7.2f} {f['storage_bytes'] / 1e9:>11.3f} "
            f"{f['peer_bytes'] / 1e9:>9.3f} {f['hashed_bytes'] / 1e9:>10.3f} {mem:>25}"
        )
    one = a["storage_bytes"] / b.replicas
    lines.append(
        f"storage bytes per cluster: {s['storage_bytes']} shared ({s['storage_bytes'] / one:.2f} x "
        f"one replica's reads), {a['storage_bytes']} alone ({b.replicas} x; derived: the shared "
        f"arm's bytes from storage and from peers, the same runs and spans); window bytes served "
        f"{s['window_bytes']} in each arm"
    )
    return "\n".join(lines)


def cmd_bench_replicas(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload bench --replicas R",
        description="R replicas x tp T in one launch, sharing the storage reads, against the R "
        "replicas each reading alone (R launches at once): wall time, storage bytes per cluster, "
        "peak memory.",
    )
    p.add_argument("--replicas", type=RANKS, default=2, help="replicas sharing the reads")
    p.add_argument("--tp", type=RANKS, default=2, help="tensor-parallel degree of each")
    p.add_argument("--preset", choices=list(PRESETS), default="medium", help="synthetic checkpoint")
    p.add_argument("--checkpoint", help="an existing checkpoint instead of a preset")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="as the load's (default auto)")
    p.add_argument("--rounds", type=COUNT, default=3, help="launches of each way")
    p.add_argument("--timeout", type=SECONDS, default=1800.0, help="seconds per launch")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    if args.replicas < 2 or args.rounds < 1:
        p.error("--replicas 2 or more and --rounds 1 or more")
    ckpt = args.checkpoint or str(preset_checkpoint(args.preset))
    with tempfile.TemporaryDirectory(prefix="tpload-bench-digests-") as store:
        Path(store).chmod(0o700)
        b = ReplicaBench(
            ckpt, args.replicas, args.tp, args.rounds, args.config, args.timeout, store
        )
        res = run_bench(b, log=lambda s: print(s, file=sys.stderr, flush=True))
    if "refused" in res:
        print(f"bench --replicas refused: {res['refused']}", flush=True)
    else:
        print(table(b, res), flush=True)
    if args.json:
        doc = {"options": asdict(b), **res}
        atomic_write(Path(args.json), json.dumps(doc, indent=1) + "\n")
    return 1 if "refused" in res else 0

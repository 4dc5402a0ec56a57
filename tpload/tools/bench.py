"""``python -m tpload bench``: tpload beside its peers, on the same job, in one run.

Each method (see :mod:`tpload.tools.bench_worker`) runs as a real torchrun job with
the same world size, alternating round by round (A B C ..., then C B A ...)
so that drift on a shared machine falls on every method alike. Figures are
medians over rounds with min-max; ratios are to the ``floor`` (copies only)
and to ``seed`` (the seed loader's method) of the same run. Before any figure
is printed, every method's per-rank window digest must equal the floor's (the
expanded kind is compared with itself across rounds): a method that served
other bytes is refused, not ranked. After the rounds, a process's first call
(:mod:`tpload.tools.first_call`) is measured once in fresh processes, unless ``--no-first-call``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any  # JSON rows and figures

import torch

from ..loading.pick import choose
from ..model.bounds import COUNT, RANKS, SECONDS
from ..model.errors import LoadError
from ..model.values import Layout
from ..options.flags import Parser
from ..selection.defaults import DEFAULT_CONFIG
from ..storage.files import atomic_write, read_json
from ..storage.pagecache import resident_bytes
from .bench_bandwidth import decode_bandwidth, decode_lines, gpu_figures
from .bench_job import blake3_store, worker_env
from .first_call import FirstCallFailed, bench_line, measure
from .first_call import summarize as summarize_first_call
from .published import cached_published, loadable_presets
from .synth import PRESETS, cached_checkpoint

PACKED_METHODS = (
    "floor",
    "tpload",
    "tpload-rank",
    "tpload-digest",
    "tpload-noverify",
    "tpload-blake3",
    "safetensors",
    "fastsafetensors",
    "runai",
    "instanttensor",
    "seed",
)
ALL_METHODS = PACKED_METHODS + ("tpload-expanded",)
MIB, GIB = 1 << 20, 1 << 30


@dataclass(frozen=True)
class BenchOptions:
    """What one bench run measures."""

    checkpoint: str
    """The checkpoint directory every method loads."""
    nproc: int = 2
    """Processes (ranks) per method run."""
    tp: int = 2
    """Tensor-parallel degree (tp x ep = nproc; ep = nproc / tp)."""
    rounds: int = 3
    """Rounds; each runs every method once, in alternating order."""
    methods: tuple[str, ...] = ALL_METHODS
    """Methods to run (a peer is dropped, with a note, when its package is not importable)."""
    cold: bool = False
    """Drop the checkpoint's pages from the page cache before every method run."""
    config: str = DEFAULT_CONFIG
    """Config name or TOML path."""
    timeout_s: float = 1800.0
    """Per method run."""
    digest_store: str = ""
    """Where tpload-digest's trusted digests are kept (the bench's own folder, never the
    operator's)."""
    first_call: bool = True
    """After the rounds, measure a process's first call once (tools/first_call.py)."""


@dataclass
class MethodResult:
    """Every run of one method: per round, every rank's figures (bench_worker's JSON)."""

    name: str
    runs: list[list[dict[str, Any]]] = field(default_factory=list)
    cache: list[float] = field(default_factory=list)
    """Resident fraction of the checkpoint in the page cache before each run."""
    refused: str = ""
    """Why no figures are shown (a failed run or a digest that disagrees); empty when fine."""


# -- page cache ----------------------------------------------------------------------------------


def resident_fraction(files: list[Path]) -> float:
    """Fraction of the files' bytes in the page cache (mincore via pagecache.py; touches
    nothing)."""
    total = sum(p.stat().st_size for p in files)
    return sum(resident_bytes(p) for p in files) / max(total, 1)


def drop_cache(files: list[Path]) -> None:
    """Ask the kernel to drop the files' clean pages (posix_fadvise DONTNEED; no root needed)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- running -------------------------------------------------------------------------------------

OPTIONAL: dict[str, tuple[str, bool]] = {
    "fastsafetensors": ("fastsafetensors", False),
    "runai": ("runai_model_streamer", False),
    "instanttensor": ("instanttensor", True),
}
"""The peers that are not tpload's dependencies: method -> (package to import, CUDA only)."""


def available_methods(
    wanted: tuple[str, ...], *, cuda: bool | None = None
) -> tuple[list[str], list[str]]:
    """(methods to run, notes about dropped ones); ``cuda``: whether the workers will have CUDA
    devices (default: whether this process does)."""
    import importlib.util

    notes, out = [], []
    for m in wanted:
        if m not in ALL_METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(ALL_METHODS)}")
        package, cuda_only = OPTIONAL.get(m, ("", False))
        if package and importlib.util.find_spec(package) is None:
            notes.append(
                f"{m}: {package} is not installed (pip install -e '.[bench]' in tpload's clone); "
                "skipped"
            )
            continue
        if cuda_only and not (torch.cuda.is_available() if cuda is None else cuda):
            notes.append(f"{m}: CUDA devices only, and there are none; skipped")
            continue
        if m == "tpload-blake3":
            from ..verification.hashes import INSTALL as BLAKE3_INSTALL
            from ..verification.hashes import available as blake3_available

            if not blake3_available():
                notes.append(
                    f"tpload-blake3: the blake3 package is not installed ({BLAKE3_INSTALL}); "
                    "skipped"
                )
                continue
        out.append(m)
    return out, notes


def prepare_digest(opts: BenchOptions) -> str:
    """Write the sha256-verified predictions tpload-digest trusts (what ``tpload plan --write``
    does, outside the timed runs, into the bench's own store). Returns why the method cannot run, or
    ""."""
    from .offline import record_verified

    try:
        record_verified(
            opts.checkpoint,
            choose(opts.config, Path(opts.checkpoint).absolute())[0],
            Layout(opts.tp, opts.nproc // opts.tp),
            "packed",
            store=opts.digest_store,
        )
    except (LoadError, OSError) as e:
        return f"no verified predictions could be written: {e}"
    return ""


def prepare_blake3(opts: BenchOptions) -> str:
    """Write the blake3 sidecar tpload-blake3 loads with (what ``tpload manifest --hash blake3``
    does, outside the timed runs). Returns why the method cannot run, or ""."""
    from .offline import write_blake3

    try:
        write_blake3(opts.checkpoint, store=blake3_store(opts.digest_store))
    except (LoadError, OSError) as e:
        return f"no blake3 sidecar could be written: {e}"
    return ""


def run_once(method: str, opts: BenchOptions, out_dir: Path) -> list[dict[str, Any]] | str:
    """One torchrun of ``method``: every rank's figures, or the failure's text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(opts.nproc),
        "--max-restarts",
        "0",
        "-m",
        "tpload.tools.bench_worker",
        method,
        opts.checkpoint,
        str(out_dir),
        "--tp",
        str(opts.tp),
        "--config",
        opts.config,
        "--digest-store",
        opts.digest_store,
    ]
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=opts.timeout_s, env=worker_env(opts.nproc)
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {opts.timeout_s:.0f} s"
    files = [out_dir / f"{method}-rank{r}.json" for r in range(opts.nproc)]
    if p.returncode != 0 or not all(f.exists() for f in files):
        lines = (p.stdout + p.stderr).strip().splitlines()
        errors = [ln for ln in lines if "Error" in ln or "SystemExit" in ln or ": error" in ln]
        return f"exit {p.returncode}: " + " | ".join(dict.fromkeys(errors[-3:] or lines[-3:]))
    rows: list[Any] = [read_json(f, "bench result") for f in files]  # each rank's JSON row
    return rows


def _mib(nbytes: float | None) -> str:
    """Bytes as MiB for the table (``-`` where nothing was counted)."""
    return "-" if nbytes is None else f"{nbytes / MIB:.0f}"


def _ratio(seconds: float, ref: float | None) -> str:
    """``seconds`` as a multiple of a reference method's (``-`` without one)."""
    return f"{seconds / ref:.2f}" if ref else "-"


def run_all(
    opts: BenchOptions, methods: list[str], log: Callable[[str], object] = print
) -> dict[str, MethodResult]:
    """Every round of every method, alternating the order round by round."""
    files = sorted(Path(opts.checkpoint).glob("*.safetensors"))
    results = {m: MethodResult(m) for m in methods}
    with tempfile.TemporaryDirectory(prefix="tpload-bench-") as tmp:
        for k in range(opts.rounds):
            for m in methods if k % 2 == 0 else list(reversed(methods)):
                if results[m].refused:
                    continue
                if opts.cold:
                    drop_cache(files)
                results[m].cache.append(resident_fraction(files))
                t0 = time.perf_counter()
                got = run_once(m, opts, Path(tmp) / f"r{k}-{m}")
                if isinstance(got, str):
                    results[m].refused = f"run failed in round {k + 1}: {got}"
                    log(f"round {k + 1}: {m}: FAILED ({got})")
                    continue
                results[m].runs.append(got)
                slowest, launch = max(r["seconds"] for r in got), time.perf_counter() - t0
                log(f"round {k + 1}: {m}: {slowest:.2f} s ({launch:.1f} s with launch)")
    check_agreement(results)
    return results


def check_agreement(results: dict[str, MethodResult]) -> None:
    """Refuse every method whose window digest differs from the reference on any rank in any round.

    The reference is the floor's first run (or the first packed method run);
    the expanded kind is held to its own first run.
    """
    packed = [r for m, r in results.items() if m in PACKED_METHODS and r.runs and not r.refused]
    ref = next((r for r in packed if r.name == "floor"), packed[0] if packed else None)
    for res in results.values():
        if res.refused or not res.runs:
            continue
        base = ref if res.name in PACKED_METHODS else res
        if base is None:
            continue
        want = [x["digest"] for x in base.runs[0]]
        for k, run in enumerate(res.runs):
            got = [x["digest"] for x in run]
            bad = [r for r, (g, w) in enumerate(zip(got, want, strict=False)) if g != w]
            if bad or len(got) != len(want):
                g, w = (got[bad[0]][:16], want[bad[0]][:16]) if bad else ("?", "?")
                res.refused = (
                    f"window digest of rank {bad[0] if bad else '?'} in round {k + 1} differs from "
                    f"{base.name}'s ({g} != {w})"
                )
                break


def measure_first_call(opts: BenchOptions, log: Callable[[str], object] = print) -> dict[str, Any]:
    """A process's first call on the bench's checkpoint and layout (tools/first_call.py): one
    torchrun job of fresh processes after the rounds, the page cache warm (after a cold bench's
    rounds, by an unmeasured job first); its summary with every rank's row, or ``failed``: why."""
    try:
        rows = measure(
            opts.checkpoint,
            nproc=opts.nproc,
            options={"tp": opts.tp, "ep": opts.nproc // opts.tp, "config": opts.config},
            warm_run=opts.cold,
            timeout_s=opts.timeout_s,
            log=log,
        )
    except FirstCallFailed as e:
        return {"failed": str(e)}
    return {**summarize_first_call(rows), "rows": rows}


# -- figures -------------------------------------------------------------------------------------


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(res: MethodResult) -> dict[str, Any]:
    """Medians (and min-max) over rounds of the per-run figures (each run: the slowest rank / the
    worst peak)."""
    walls = [max(x["seconds"] for x in run) for run in res.runs]
    per_rank = [statistics.mean(x["window_bytes"] for x in run) for run in res.runs]
    transient = [
        max(x["anon_peak"] - x["anon_before"] - x["window_bytes"] for x in run) for run in res.runs
    ]
    largest = max((x["largest_window"] for run in res.runs for x in run), default=0)
    tensors = _med([statistics.mean(x.get("tensors", 0) for x in run) for run in res.runs])
    return {
        "method": res.name,
        "rounds": len(res.runs),
        "seconds": _med(walls),
        "seconds_min": min(walls, default=float("nan")),
        "seconds_max": max(walls, default=float("nan")),
        "gb_per_s_per_rank": _med(per_rank) / 1e9 / max(_med(walls), 1e-9),
        # CPU seconds of the busiest rank (all its threads): its own work, whatever the ranks share
        # cores with.
        "cpu_seconds": _med(
            [max(x.get("cpu_seconds", float("nan")) for x in run) for run in res.runs]
        ),
        "window_bytes_per_rank": _med(per_rank),
        "bytes_hashed_per_rank": _med(
            [statistics.mean(x["bytes_hashed"] for x in run) for run in res.runs]
        ),
        "rss_peak": _med([max(x["rss_peak"] for x in run) for run in res.runs]),
        "anon_peak": _med([max(x["anon_peak"] for x in run) for run in res.runs]),
        "transient": _med(transient),
        "largest_window": largest,
        "transient_limit": 2 * largest + 64 * MIB,
        "device_peak": _med([max(x["device_peak"] for x in run) for run in res.runs]),
        "page_cache_before": _med(res.cache),
        "digests": [x["digest"] for x in res.runs[0]] if res.runs else [],
        "import_seconds": _med(
            [max(x.get("import_seconds", float("nan")) for x in run) for run in res.runs]
        ),
        "startup_seconds": _med(
            [max(x.get("startup_seconds", float("nan")) for x in run) for run in res.runs]
        ),
        "bytes_read_per_rank": _med(
            [
                statistics.mean(x.get("bytes_read", x["window_bytes"]) for x in run)
                for run in res.runs
            ]
        ),
        **storage_reads(res),
        "reads": next((x["reads"] for run in res.runs for x in run if x.get("reads")), "windows"),
        "tensors_per_rank": tensors,
        # per-tensor cost beside bytes: the load's seconds over the tensors each rank ends up with
        "us_per_tensor": _med(walls) / tensors * 1e6 if tensors else float("nan"),
        "note": next((x["note"] for run in res.runs for x in run if x.get("note")), ""),
    }


def storage_reads(res: MethodResult) -> dict[str, Any]:
    """The bytes each rank read from storage during the load, by the kernel's count (each rank's
    ``/proc/self/io`` ``read_bytes``, the delta over the load: every thread of the process, hash
    workers included; a page another rank brought into the page cache first is not counted):
    ``storage_read_ranks`` per rank, median over rounds, ``storage_read_per_rank`` the median over
    rounds of the ranks' mean, ``storage_read_max_rank`` of their most, ``storage_read_node`` of
    their sum (the node's: which rank paid for a page moves between rounds, the sum does not).
    None where the kernel does not count."""
    got = [[x.get("storage_read_bytes") for x in run] for run in res.runs]
    counted: list[list[int]] = [[v for v in run if v is not None] for run in got]
    if not counted or any(len(c) != len(run) for c, run in zip(counted, got, strict=True)):
        return {
            "storage_read_ranks": None,
            "storage_read_per_rank": None,
            "storage_read_max_rank": None,
            "storage_read_node": None,
        }
    ranks = min(len(run) for run in counted)
    return {
        "storage_read_ranks": [_med([run[r] for run in counted]) for r in range(ranks)],
        "storage_read_per_rank": _med([statistics.mean(run) for run in counted]),
        "storage_read_max_rank": _med([max(run) for run in counted]),
        "storage_read_node": _med([sum(run) for run in counted]),
    }


def storage_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """One line per method: the bytes each rank read from storage (MiB), and the most a rank read
    against the floor's share a rank (its mean: the floor reads each byte once a node, its windows'
    pages, whichever rank gets there first) and against the floor's most; and the node's sum
    against the floor's (each stored byte a window needs, read once a node, is the floor's sum)."""
    floor = next((s for s in summaries if s["method"] == "floor"), {})
    share, most = floor.get("storage_read_per_rank"), floor.get("storage_read_max_rank")
    whole = floor.get("storage_read_node")
    out = []
    for s in summaries:
        ranks = s.get("storage_read_ranks")
        if ranks is None:
            continue
        top = s["storage_read_max_rank"]
        ratio = (
            f" ({top / share:.2f}x the floor's share, {top / most:.2f}x its most)"
            if share and most
            else ""
        )
        node = s.get("storage_read_node")
        summed = (
            f"; the node {node / MIB:,.0f}"
            + (f" ({node / whole:.2f}x the floor's)" if whole else "")
            if node is not None
            else ""
        )
        out.append(
            f"  {s['method']:<16} "
            + " / ".join(f"{v / MIB:,.0f}" for v in ranks)
            + f" MiB, the most a rank {top / MIB:,.0f}{ratio}{summed}"
        )
    if not out:
        return []
    return [
        "read from storage during the load, per rank (the kernel's read_bytes of each rank's "
        "process, all its threads; medians over rounds; the floor's share: its mean a rank):"
    ] + out


READS = {"windows": "windows", "whole tensors": "tensors", "whole files": "files"}
"""What a method reads of each tensor it has a window of, as the table's ``reads`` column says it.
"""


def table(summaries: list[dict[str, Any]], refused: dict[str, str], opts: BenchOptions) -> str:
    """The human table: one line per method, ratios to floor and seed."""
    by = {s["method"]: s for s in summaries}
    floor, seed = by.get("floor", {}).get("seconds"), by.get("seed", {}).get("seconds")
    head = (
        f"tpload bench: {opts.checkpoint}\n  nproc {opts.nproc}, tp {opts.tp}, "
        f"{opts.rounds} round(s), {'cold' if opts.cold else 'warm'} page cache; seconds: median "
        "[min-max] of the slowest rank, memory: worst rank, median over rounds\n"
    )
    cols = (
        f"{'method':<16} {'sec':>6} {'[min-max]':>13} {'import s':>8} {'cpu s':>6} "
        f"{'GB/s/rank':>9} {'x floor':>7} {'x seed':>6} {'tensors':>7} {'us/tensor':>9} "
        f"{'reads':>7} {'read MB':>8} {'disk MiB':>8} {'hashed GB':>9} {'rss GiB':>7} "
        f"{'anon GiB':>8} {'trans MiB':>9} {'limit MiB':>9} {'dev GiB':>7} {'cache':>5}"
    )
    lines = [head, cols]
    for s in summaries:
        span = f"[{s['seconds_min']:.2f}-{s['seconds_max']:.2f}]"
        lines.append(
            f"{s['method']:<16} {s['seconds']:>6.2f} {span:>13} {s['import_seconds']:>8.2f} "
            f"{s['cpu_seconds']:>6.2f} "
            f"{s['gb_per_s_per_rank']:>9.2f} {_ratio(s['seconds'], floor):>7} "
            f"{_ratio(s['seconds'], seed):>6} "
            f"{s['tensors_per_rank']:>7.0f} {s['us_per_tensor']:>9.1f} "
            f"{READS.get(s['reads'], s['reads']):>7} "
            f"{s['bytes_read_per_rank'] / 1e6:>8.1f} {_mib(s['storage_read_per_rank']):>8} "
            f"{s['bytes_hashed_per_rank'] / 1e9:>9.3f} "
            f"{s['rss_peak'] / GIB:>7.2f} {s['anon_peak'] / GIB:>8.2f} "
            f"{s['transient'] / MIB:>9.0f} {s['transient_limit'] / MIB:>9.0f} "
            f"{s['device_peak'] / GIB:>7.2f} "
            f"{s['page_cache_before'] * 100:>4.0f}%" + (f"  ({s['note']})" if s["note"] else "")
        )
    for m, why in refused.items():
        lines.append(f"{m:<16} REFUSED: {why}")
    lines += [
        "import s = the method's own imports (tpload: its loader and numba kernels; a peer: its "
        "package), once per process, outside the clock; cpu s = CPU seconds (all threads) of the "
        "busiest rank",
        "tensors = tensors each rank ends up with; us/tensor = sec over them; reads = what a "
        "method reads of each tensor it has a window of: its window, the whole tensor "
        "(tensors), or whole files shared out (files); read MB = bytes a rank read out of the "
        "files that way (hashing reads are hashed GB); disk MiB = bytes a rank read from storage "
        "(the kernel's count, mean over ranks; below, per rank)",
        "trans = anonymous peak beyond the process before the run and the windows it owns; "
        "limit = 2 x largest window + 64 MiB",
    ]
    lines += storage_lines(summaries)
    startup = [
        s["startup_seconds"] for s in summaries if s["startup_seconds"] == s["startup_seconds"]
    ]
    if startup:
        lines.append(
            f"before its own imports every worker spent {statistics.median(startup):.2f} s "
            "(median) starting python, torch and the bench's planner"
        )
    return "\n".join(lines)


def preset_checkpoint(preset: str, *, tensors: int | None = None) -> Path:
    """A bench preset's checkpoint, written once under the cache: the reference layout or a
    published one."""
    if preset in PRESETS:
        return cached_checkpoint(PRESETS[preset])
    return cached_published(preset, tensors=tensors)


def cmd_bench(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload bench",
        description="Run tpload beside its peers on the same "
        "job (every rank's windows in its own memory) and print a table of ratios, then a "
        "process's first call (fresh processes: after import torch to the first weight byte).",
    )
    p.add_argument(
        "--preset",
        choices=list(PRESETS) + loadable_presets(),
        default="medium",
        metavar="NAME",
        help="synthetic checkpoint, made once and cached: the reference layout (small, medium, "
        "seed) or a published family's (NAME-tiny, deepseek-v3-deep; many-tensors: per-tensor cost "
        "apart from bytes); default medium: " + ", ".join(list(PRESETS) + loadable_presets()),
    )
    p.add_argument(
        "--tensors",
        type=COUNT,
        metavar="N",
        help="(--preset many-tensors) how many tiny tensors (default 10000)",
    )
    p.add_argument("--checkpoint", metavar="DIR", help="an existing checkpoint instead of a preset")
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, metavar="NAME|PATH", help="as the load's (default auto)"
    )
    p.add_argument("--nproc", type=RANKS, default=2, metavar="N", help="ranks (default 2)")
    p.add_argument("--tp", type=RANKS, metavar="TP", help="tensor-parallel degree (default: nproc)")
    p.add_argument("--rounds", type=COUNT, default=3, metavar="N", help="runs of each method")
    p.add_argument(
        "--methods",
        default=",".join(ALL_METHODS),
        metavar="LIST",
        help=f"comma-separated subset of {','.join(ALL_METHODS)}",
    )
    p.add_argument(
        "--cold", action="store_true", help="drop the checkpoint's pages before every run"
    )
    p.add_argument("--json", metavar="FILE", help="write every figure here")
    p.add_argument("--no-decode", action="store_true", help="skip the decode-vs-memcpy measure")
    p.add_argument(
        "--no-first-call",
        action="store_true",
        help="skip the first-call measure (after the rounds, fresh processes: from just after "
        "import torch to the first weight byte read, imports included; one more torchrun job)",
    )
    p.add_argument(
        "--timeout", type=SECONDS, default=1800.0, metavar="S", help="seconds per method run"
    )
    args = p.parse_args(argv)
    if (
        args.nproc < 1
        or args.rounds < 1
        or (args.tp or 1) < 1
        or args.nproc % (args.tp or args.nproc)
    ):
        p.error("nproc >= 1, rounds >= 1 and a tp dividing nproc are required")
    if args.tensors is not None and (
        not (args.preset or "").startswith("many-tensors") or args.checkpoint or args.tensors < 1
    ):
        p.error("--tensors N (N >= 1) goes with --preset many-tensors[-alternating]")
    ckpt = args.checkpoint or str(preset_checkpoint(args.preset, tensors=args.tensors))
    store = tempfile.mkdtemp(prefix="tpload-bench-digests-")
    opts = BenchOptions(
        ckpt,
        args.nproc,
        args.tp or args.nproc,
        args.rounds,
        tuple(args.methods.split(",")),
        args.cold,
        args.config,
        args.timeout,
        store,
        not args.no_first_call,
    )
    try:
        methods, notes = available_methods(opts.methods)
    except ValueError as e:
        p.error(str(e))
    for method, prepare in (("tpload-digest", prepare_digest), ("tpload-blake3", prepare_blake3)):
        why = prepare(opts) if method in methods else ""
        if why:
            notes.append(f"{method}: {why}; skipped")
            methods.remove(method)
    for n in notes:
        print(n, flush=True)
    results = run_all(opts, methods, log=lambda s: print(s, file=sys.stderr, flush=True))
    summaries = [summarize(r) for r in results.values() if r.runs and not r.refused]
    refused = {m: r.refused for m, r in results.items() if r.refused}
    print(table(summaries, refused, opts), flush=True)
    first = None
    if opts.first_call:
        first = measure_first_call(opts, log=lambda s: print(s, file=sys.stderr, flush=True))
        print(
            f"first call: FAILED ({first['failed']})" if "failed" in first else bench_line(first),
            flush=True,
        )
    decode = None
    if not args.no_decode:
        decode = decode_bandwidth(
            ckpt, threads=int(worker_env(opts.nproc)["OMP_NUM_THREADS"]), config=opts.config
        )
        print("\n".join(decode_lines(decode)), flush=True)
    gpu = (
        gpu_figures(ckpt, opts.config, summaries, decode=not args.no_decode)
        if torch.cuda.is_available()
        else None
    )
    if args.json:
        doc = {
            "options": asdict(opts),
            "notes": notes,
            "methods": summaries,
            "refused": refused,
            "decode": decode,
            "gpu": gpu,
            "first_call": first,
            "runs": {m: {"runs": r.runs, "page_cache_before": r.cache} for m, r in results.items()},
        }
        atomic_write(Path(args.json), json.dumps(doc, indent=1) + "\n")
    return 0 if not refused and not (first and "failed" in first) else 1

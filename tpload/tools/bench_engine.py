"""``python -m tpload bench --engine vllm DIR``: vLLM's default loader beside ``--load-format
tpload`` on the same model, in one run: engine start to first token, and bytes read per worker.

Each format is started by :mod:`tpload.integrations.vllm_run` under the Python that has vLLM
(``--vllm-python``), in alternating order over rounds. Before a figure is shown, both formats
must have produced the same greedy tokens and every worker the same parameter bytes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any  # JSON rows and figures

from ..model.bounds import COUNT, RANKS, SECONDS
from ..options.flags import Parser
from ..storage.catalogue import read_native
from ..storage.files import atomic_write, read_json

FORMATS = {"vllm-default": "auto", "vllm-tpload": "tpload"}


def default_python() -> str:
    """The Python with vLLM: $TPLOAD_VLLM_PYTHON, else this one (``--vllm-python`` names
    another)."""
    return os.environ.get("TPLOAD_VLLM_PYTHON") or sys.executable


def engine_env() -> dict[str, str]:
    """vLLM's CPU build on a small host: a 1 GiB KV cache, one OpenMP core per worker, and the
    worker RPC allowed to carry the digest function."""
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"),
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_formats(
    python: str,
    model: str,
    *,
    tp: int,
    formats: list[str],
    extra: dict[str, Any],
    work: Path,
    timeout: float,
    dtype: str = "bfloat16",
) -> tuple[list[dict[str, Any]], str]:
    """One engine process starting each format in turn: (results, its output)."""
    out = work / f"run-{len(list(work.iterdir()))}.json"
    cmd = [
        python,
        "-m",
        "tpload.integrations.vllm_run",
        model,
        "--tp",
        str(tp),
        "--formats",
        ",".join(formats),
        "--extra",
        json.dumps(extra),
        "--report-dir",
        str(work),
        "--out",
        str(out),
        "--dtype",
        dtype,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=engine_env())
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 or not out.exists():
        return [], text
    rows: Any = read_json(out, "engine results")  # the worker's JSON: a list of rows
    return list(rows), text


def disagreement(results: list[dict[str, Any]]) -> str:
    """Why two formats' results may not be ranked (different tokens or parameter bytes), or ""."""
    first = results[0]
    for r in results[1:]:
        if r["tokens"] != first["tokens"]:
            return f"{r['format']} generated {r['tokens']}, {first['format']} {first['tokens']}"
        for w, (a, b) in enumerate(zip(first["parameters"], r["parameters"], strict=False)):
            differ = sorted(n for n in a if a[n] != b.get(n)) + sorted(set(b) - set(a))
            if differ:
                return (
                    f"worker {w}: {len(differ)} parameter(s) differ between {first['format']} and "
                    f"{r['format']}: " + ", ".join(differ[:5])
                )
    return ""


def summary(runs: dict[str, list[dict[str, Any]]], model: str, tp: int) -> list[dict[str, Any]]:
    """Per format: median start-to-first-token over rounds, and bytes read per worker."""
    whole = sum(info.nbytes for info in read_native(Path(model))[0].tensors.values())
    rows = []
    for name, results in runs.items():
        seconds = [r["start_to_first_token_s"] for r in results]
        if FORMATS[name] == "tpload":
            report = results[-1]["report"]
            read = [r["bytes_read"] for r in report["ranks"]]
            how = "its windows (the report)"
            rise = [r["rss_rise"] for r in report["engine"]["ranks"]]
        else:
            read, how, rise = [whole] * tp, "every tensor whole (vLLM's safetensors iterator)", None
        rows.append(
            {
                "method": name,
                "start_to_first_token_s": statistics.median(seconds),
                "min_s": min(seconds),
                "max_s": max(seconds),
                "bytes_read_per_worker": read,
                "read": how,
                "rss_rise": rise,
            }
        )
    return rows


def table(rows: list[dict[str, Any]], model: str, tp: int) -> str:
    out = [
        f"vLLM on {model}, tp {tp}: engine start to first token (median, min-max), bytes read per "
        "worker",
        f"{'method':<14} {'start->token s':>15} {'min-max':>13} {'read MB/worker':>15}  what it "
        "read",
    ]
    for r in rows:
        mb = "/".join(f"{b / 1e6:.2f}" for b in r["bytes_read_per_worker"])
        out.append(
            f"{r['method']:<14} {r['start_to_first_token_s']:>15.1f} "
            f"{r['min_s']:>6.1f}-{r['max_s']:<6.1f} {mb:>15}  {r['read']}"
        )
    return "\n".join(out)


def cmd_bench_engine(argv: list[str]) -> int:
    p = Parser(prog="python -m tpload bench --engine vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["vllm"], required=True, help="the serving engine")
    p.add_argument(
        "checkpoint",
        help="a model folder vLLM can serve (config.json, safetensors, a tpload manifest)",
    )
    p.add_argument("--tp", type=RANKS, default=2, help="the engine's tensor-parallel size")
    p.add_argument("--rounds", type=COUNT, default=1, help="engine starts of each loader")
    p.add_argument(
        "--vllm-python",
        default=default_python(),
        help="the Python that has vLLM (and tpload) installed",
    )
    p.add_argument("--extra", default="{}", help="tpload's model loader extra config (JSON)")
    p.add_argument("--dtype", default="bfloat16", help="the engine's compute dtype")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--timeout", type=SECONDS, default=1200.0, help="seconds per engine process")
    args = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in FORMATS}
    work = Path(tempfile.mkdtemp(prefix="tpload-bench-engine-"))
    for k in range(args.rounds):
        order = list(FORMATS) if k % 2 == 0 else list(reversed(FORMATS))
        results, text = run_formats(
            args.vllm_python,
            args.checkpoint,
            tp=args.tp,
            formats=[FORMATS[n] for n in order],
            extra=json.loads(args.extra),
            work=work,
            timeout=args.timeout,
            dtype=args.dtype,
        )
        if not results:
            print(f"round {k + 1}: vLLM failed; its output ends:\n{text[-3000:]}", file=sys.stderr)
            return 1
        why = disagreement(results)
        if why:
            print(f"refused: the formats served different models: {why}", file=sys.stderr)
            return 1
        for name, result in zip(order, results, strict=False):
            runs[name].append(result)
    rows = summary(runs, args.checkpoint, args.tp)
    print(table(rows, args.checkpoint, args.tp), flush=True)
    if args.json:
        atomic_write(
            Path(args.json),
            json.dumps({"tp": args.tp, "rows": rows, "runs": runs}, indent=1) + "\n",
        )
    return 0

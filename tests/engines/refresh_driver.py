"""One vLLM engine (the CPU build) with the weight-transfer backend ``tpload`` at one TP size, and
a 2-rank trainer (this process is trainer rank 0 and holds the ``LLM``; rank 1 is a spawned
child) taking it through good and bad rounds. Run by the Python that has vLLM
(tests/engines/test_vllm_refresh.py reads what it writes):

    python tests/engines/refresh_driver.py --model DIR --tp 2 --work W --out result.json

Rounds, in order (each trainer rank holds every other tensor, ``held_names``):
    v1, v2 good; then a byte flipped in transit (v3), a tensor missing (v3), a repeated version
    (v2), an older version (v1), trainer rank 1 killed mid-update (v3); then v3 good.
After each: greedy tokens, vLLM's weight_version, and every worker's own account (served version,
the last refusal, digests) through the worker RPC. At the end v3's weights are written as a
checkpoint (W/v3) and a fresh engine on it gives its tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

SHORT = [1, 5, 9, 33, 100]
LONG = [(7 * i + 3) % 500 + 1 for i in range(70)]  # > 2 blocks of 32: its prefix is cached
GOOD, FLIP, MISSING, KILL = "good", "flipped byte", "missing tensor", "trainer killed"
ROUNDS = [
    (1, GOOD),
    (2, GOOD),
    (3, FLIP),
    (3, MISSING),
    (2, "repeated version"),
    (1, "older version"),
    (3, KILL),
    (3, GOOD),
]
FLIPPED = "model.layers.0.self_attn.o_proj.weight"
DROPPED = "model.layers.1.mlp.up_proj.weight"
T0 = time.time()


def note(what: str, **kw: object) -> None:
    print(f"=== [{time.time() - T0:6.1f}s] {what} {kw}", flush=True)


def weights(model: Path, version: int) -> dict:
    """Version ``version`` of the trainer's weights: the checkpoint's, with three tensors (in both
    layers and split both ways at TP 2) drawn again from a seed of the version."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(model.glob("*.safetensors")):
        out.update(load_file(str(f)))
    g = torch.Generator().manual_seed(1000 + version)
    for name in (
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
    ):
        t = out[name]
        out[name] = (torch.randn(t.shape, generator=g) * 0.5).to(t.dtype)
    return dict(sorted(out.items()))


def source(tensors: dict, rank: int, *, ranks: int = 2, drop: str | None = None):
    """vLLM's WeightSource over ``tensors``; trainer rank ``rank`` of ``ranks`` holds every
    ``ranks``-th name."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    names = [n for n in tensors if n != drop]
    held = set(names[rank::ranks])

    class Split(WeightSource):
        def metadata(self):
            return [ParamMeta(n, tensors[n].dtype, tuple(tensors[n].shape)) for n in names]

        def __iter__(self):
            for n in names:
                yield n, (tensors[n] if n in held else None)

        def held_names(self):
            return held

    return Split()


def faults(kind: str, rank: int) -> None:
    """Plant this round's fault in this trainer rank's sender (refresh_faults.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import refresh_faults

    refresh_faults.plant(kind, rank, flipped=FLIPPED)


def trainer_rank1(model: str, port: int, world_port: int, rounds: list, out: str) -> None:
    """Trainer rank 1: the same rounds, in lockstep with rank 0 through the trainer group."""
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    import refresh_faults

    from tpload.integrations.vllm_trainer import TploadTrainerEngine, TploadTrainerInitInfo

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{world_port}",
        rank=1,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    trainer = TploadTrainerEngine.trainer_init(TploadTrainerInitInfo(rank=1), client=None)
    seen = []
    for version, kind in rounds:
        refresh_faults.plant(kind, 1, flipped=FLIPPED)
        trainer.source = source(
            weights(Path(model), version), 1, drop=DROPPED if kind == MISSING else None
        )
        try:
            trainer.send_weights(version=version)
            seen.append({"version": version, "kind": kind, "error": ""})
        except Exception as e:  # noqa: BLE001
            seen.append({"version": version, "kind": kind, "error": str(e)})
        finally:
            refresh_faults.plant(GOOD, 1, flipped=FLIPPED)
        Path(out).write_text(json.dumps(seen))
    trainer.shutdown()
    dist.destroy_process_group()


def worker_state(worker) -> dict:
    """In each vLLM worker: what its tpload engine says."""
    engine = worker.weight_transfer_engine
    r = engine.receiver
    return {
        "rank": engine.rank,
        "served_version": engine.served_version,
        "refused": engine.refused,
        "failed": engine.failed,
        "session_active": bool(worker._weight_update_active),
        "digests": list(r.figures.digests) if r is not None and r.figures is not None else None,
        "staged_bytes": r.staged_bytes if r else None,
    }


def make_llm(model: Path, tp: int, backend: str | None):
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    kw = {"weight_transfer_config": WeightTransferConfig(backend=backend)} if backend else {}
    return LLM(
        model=str(model),
        tensor_parallel_size=tp,
        enforce_eager=True,
        max_model_len=128,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        block_size=32,
        **kw,
    )


def greedy(llm, prompt: list[int], n: int = 8) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=list(prompt))],
        SamplingParams(temperature=0, max_tokens=n),
        use_tqdm=False,
    )
    return list(out[0].outputs[0].token_ids)


def tokens(llm) -> dict:
    return {"short": greedy(llm, SHORT), "long": greedy(llm, LONG)}


def spawn_rank1(ctx, model: Path, rounds: list, work: Path, n: int):
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    from refresh_faults import free_port

    port = free_port()
    child = ctx.Process(
        target=trainer_rank1, args=(str(model), 0, port, rounds, str(work / f"rank1-{n}.json"))
    )
    child.start()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    return child


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model, work = Path(args.model), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    import refresh_faults
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    from tpload.integrations.vllm_trainer import (
        LLMWeightSync,
        TploadTrainerEngine,
        TploadTrainerInitInfo,
    )

    result: dict = {"tp": args.tp, "rounds": []}
    t = time.perf_counter()
    llm = make_llm(model, args.tp, "tpload")
    result["engine_start_s"] = round(time.perf_counter() - t, 1)
    result["v0"] = tokens(llm)
    note("engine up", tokens=result["v0"])
    client = LLMWeightSync(llm)
    ctx = mp.get_context("spawn")
    kill_at = next(i for i, (_, k) in enumerate(ROUNDS) if k == KILL)
    # trainer rank 1 runs the rounds up to the kill; a second one runs the rest
    parts = [ROUNDS[: kill_at + 1], ROUNDS[kill_at + 1 :]]
    for n, part in enumerate(parts):
        child = spawn_rank1(ctx, model, part, work, n)
        trainer = WeightTransferTrainerFactory.trainer_init(
            TploadTrainerInitInfo(rank=0), client=client
        )
        assert isinstance(trainer, TploadTrainerEngine)
        for version, kind in part:
            refresh_faults.plant(kind, 0, flipped=FLIPPED)
            trainer.source = source(
                weights(model, version), 0, drop=DROPPED if kind == MISSING else None
            )
            t = time.perf_counter()
            try:
                figures = trainer.send_weights(version=version)
                error = ""
            except Exception as e:  # noqa: BLE001
                figures, error = None, str(e)
            finally:
                refresh_faults.plant(GOOD, 0, flipped=FLIPPED)
            took = time.perf_counter() - t
            t = time.perf_counter()
            toks = tokens(llm)
            row = {
                "version": version,
                "kind": kind,
                "error": error,
                "round_s": round(took, 3),
                "first_tokens_s": round(time.perf_counter() - t, 3),
                "tokens": toks,
                "weight_version": llm.get_weight_version(),
                "workers": llm.collective_rpc(worker_state),
                "digests": refresh_faults.digests(figures),
            }
            result["rounds"].append(row)
            note(
                f"round v{version} {kind}",
                error=error[:300],
                tokens=toks,
                weight_version=row["weight_version"],
                workers=row["workers"],
            )
        child.join(60)
        result[f"rank1_exit_{n}"] = child.exitcode
        trainer.shutdown()
        dist.destroy_process_group()
    for n in range(len(parts)):
        f = work / f"rank1-{n}.json"
        result[f"rank1_{n}"] = json.loads(f.read_text()) if f.exists() else None
    refresh_faults.write_checkpoint(model, weights(model, ROUNDS[-1][0]), work / "v3")
    Path(args.out).write_text(json.dumps(result, indent=1))
    llm.llm_engine.engine_core.shutdown()
    del llm, client
    gc.collect()
    fresh = make_llm(work / "v3", args.tp, None)
    result["fresh_v3"] = tokens(fresh)
    fresh.llm_engine.engine_core.shutdown()
    note("fresh engine on v3", tokens=result["fresh_v3"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    os._exit(code)  # vLLM's engine processes: no waiting on their teardown

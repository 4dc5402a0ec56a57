"""The vLLM arm of the refresh bench: from a trainer's ``start_weight_update`` to the first token of
the new version (weight-transfer backend ``tpload``, every window checked on receipt), against
vLLM's own ``reload_weights`` from a checkpoint folder of the same weights, on one engine.

    python launch/refresh-vllm.py [--tp 2] [--rounds 4] [--check fingerprint|sha256] [--json F]

Run by the Python that has vLLM (its CPU build: tests/engines/vllm_env.py makes one), from the
repository root. The model is the tiny Llama (``llama-tiny``), written to a temporary folder.
Each round makes a new version (three tensors drawn again), writes it as a checkpoint, and times,
in alternating order:

* ``tpload``: a 1-rank trainer's ``send_weights`` (start_weight_update, update_weights beside the
  send, the verdict, finish through vLLM's layerwise reload, the prefix cache reset), then one
  greedy token;
* ``reload``: ``collective_rpc("reload_weights", weights_path=...)`` (vLLM reads the folder whole,
  checks nothing), the prefix cache reset, then one greedy token.

Before a figure is shown, both must have produced the same 8 greedy tokens for the version. The
files were just written, so the folder is in the page cache: vLLM's read is at memory speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tpload

PROMPT = [1, 5, 9, 33, 100]


def version_weights(base: dict, version: int) -> dict:
    import torch

    out = dict(base)
    g = torch.Generator().manual_seed(1000 + version)
    for name in (
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
    ):
        out[name] = (torch.randn(base[name].shape, generator=g) * 0.5).to(base[name].dtype)
    return out


def greedy(llm, n: int) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=PROMPT)],
        SamplingParams(temperature=0, max_tokens=n),
        use_tqdm=False,
    )
    return list(out[0].outputs[0].token_ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--check", default="fingerprint", choices=["fingerprint", "sha256"])
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import shutil

    from safetensors.torch import load_file, save_file
    from vllm import LLM
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    from tpload.integrations.vllm_trainer import LLMWeightSync, TploadTrainerInitInfo
    from tpload.tools.published import write_published

    work = Path(tempfile.mkdtemp(prefix="refresh-vllm-"))
    model = write_published(work / "llama", "llama-tiny")
    base = {}
    for f in sorted(model.glob("*.safetensors")):
        base.update(load_file(str(f)))
    llm = LLM(
        model=str(model),
        tensor_parallel_size=args.tp,
        enforce_eager=True,
        max_model_len=128,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        block_size=32,
        weight_transfer_config=WeightTransferConfig(backend="tpload"),
    )
    greedy(llm, 8)
    trainer = WeightTransferTrainerFactory.trainer_init(
        TploadTrainerInitInfo(rank=0, check=args.check), client=LLMWeightSync(llm)
    )
    times: dict[str, list[float]] = {"tpload": [], "reload": []}
    rounds = []
    for k in range(1, args.rounds + 1):
        weights = version_weights(base, k)
        folder = work / f"v{k}"
        folder.mkdir()
        shutil.copy(model / "config.json", folder / "config.json")
        save_file(weights, str(folder / "model.safetensors"))
        tokens = {}
        order = ["tpload", "reload"] if k % 2 else ["reload", "tpload"]
        for method in order:
            t0 = time.perf_counter()
            if method == "tpload":
                trainer.source = dict(sorted(weights.items()))
                trainer.send_weights(version=k)
            else:
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
                llm.reset_prefix_cache()
            greedy(llm, 1)
            times[method].append(time.perf_counter() - t0)
            tokens[method] = greedy(llm, 8)
        if tokens["tpload"] != tokens["reload"]:
            print(f"round {k}: tokens differ: {tokens}", file=sys.stderr)
            return 1
        rounds.append(
            {"version": k, "tokens": tokens["tpload"], **{m: times[m][-1] for m in times}}
        )
    print(
        f"vLLM (CPU build) on llama-tiny, tp {args.tp}, check {args.check}, {args.rounds} rounds:"
    )
    print("seconds from start to the first token of the new version (median, min-max)")
    for m, what in (
        ("tpload", "weight-transfer backend tpload: windows checked on receipt"),
        ("reload", "vLLM's reload_weights from a checkpoint folder (page cache), unchecked"),
    ):
        t = times[m]
        print(f"{m:8s} {statistics.median(t):7.3f}  {min(t):.3f}-{max(t):.3f}  {what}")
    ratio = statistics.median(times["tpload"]) / statistics.median(times["reload"])
    print(f"ratio tpload / reload: {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"tp": args.tp, "check": args.check, "rounds": rounds, "ratio": ratio}, indent=1
            )
        )
    trainer.shutdown()
    llm.llm_engine.engine_core.shutdown()  # its engine processes end with it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

"""Start vLLM on a checkpoint with given load formats, one engine after another, and write what
each served: ``python -m tpload.integrations.vllm_run DIR --tp 2 --formats auto,tpload --out
r.json``.

For each format: seconds from engine start to the first generated token, the greedy tokens of
fixed prompt ids, and every worker's sha256 of every parameter's bytes after loading (through
the engine's worker RPC); for ``tpload``, the load report (``--report-dir``). The tests and
``tpload bench --engine vllm`` compare formats with it. Run by the Python that has vLLM.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

from ..model.values import JsonObject
from .engine_objects import VllmWorker

PROMPTS = ([1, 5, 9, 33, 100], [7, 7, 3, 250, 19, 2])
"""Fixed prompt token ids (no tokenizer: the test models are random)."""


def parameter_digests(worker: VllmWorker) -> dict[str, str]:
    """Run in each worker: {name: sha256 of its bytes} of every tensor the loaded model holds:
    parameters, buffers, and the tensors its layers derive after loading (MLA's absorbed
    weights)."""
    import hashlib

    import torch

    model = worker.model_runner.get_model()
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not attr.startswith("_"):
                tensors.setdefault(f"{prefix}.{attr}" if prefix else attr, value)
    out: dict[str, str] = {}
    for name, t in tensors.items():
        data = t.detach().contiguous().cpu()
        digest = hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        digest.update(repr((tuple(t.shape), tuple(t.stride()), str(t.dtype))).encode())
        out[name] = digest.hexdigest()
    return out


def run(
    model: str,
    tp: int,
    fmt: str,
    extra: JsonObject,
    max_tokens: int,
    dtype: str = "bfloat16",
) -> JsonObject:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        tensor_parallel_size=tp,
        load_format=fmt,
        model_loader_extra_config=extra,
        enforce_eager=True,
        max_model_len=128,
        skip_tokenizer_init=True,
        dtype=dtype,
        seed=0,
    )
    first = llm.generate(
        [TokensPrompt(prompt_token_ids=list(PROMPTS[0]))],
        SamplingParams(temperature=0, max_tokens=1),
    )
    to_first = time.perf_counter() - t0
    # One prompt at a time: a batch's composition depends on the engine's timing, and vLLM's CPU
    # kernels are not batch-invariant (seen: one prompt's greedy tokens changed with a neighbour in
    # the batch).
    outs = [
        llm.generate(
            [TokensPrompt(prompt_token_ids=list(p))],
            SamplingParams(temperature=0, max_tokens=max_tokens),
        )[0]
        for p in PROMPTS
    ]
    digests = llm.collective_rpc(parameter_digests)
    result = {
        "format": fmt,
        "start_to_first_token_s": round(to_first, 3),
        "first": list(first[0].outputs[0].token_ids),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "parameters": digests,
    }
    del llm
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tpload.integrations.vllm_run", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("model")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument(
        "--formats", default="auto,tpload", help="comma-separated load formats, run in this order"
    )
    ap.add_argument("--extra", default="{}", help="tpload's model loader extra config (JSON)")
    ap.add_argument(
        "--report-dir", default="", help="tpload writes its report here as report-tp{N}.json"
    )
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        help="the engine's compute dtype (the checkpoint's stays as stored)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault(
        "VLLM_ALLOW_INSECURE_SERIALIZATION", "1"
    )  # the digest function crosses to the workers
    results = []
    for fmt in args.formats.split(","):
        extra = json.loads(args.extra) if fmt == "tpload" else {}
        report = (
            os.path.join(args.report_dir, f"report-tp{args.tp}.json")
            if args.report_dir and fmt == "tpload"
            else ""
        )
        if report:
            extra = {**extra, "report": report}
        result = run(args.model, args.tp, fmt, extra, args.max_tokens, args.dtype)
        if report:
            from ..storage.files import read_json

            result["report"] = read_json(Path(report), "load report")
        results.append(result)
        print(
            f"{fmt}: start to first token {result['start_to_first_token_s']} s, tokens "
            f"{result['tokens']}",
            flush=True,
        )
    from ..storage.files import atomic_write

    atomic_write(Path(args.out), json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

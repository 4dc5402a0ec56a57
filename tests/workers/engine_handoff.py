"""Run under torchrun (2 ranks, gloo): one worker's load into an engine (integrations/engine.py)
with a stand-in engine whose loader narrows the way vLLM's do, five times in one world:

* ``ok``: every window handed over, the report written with the hand-off's figures;
* ``outside``: rank 1's loader asks a split tensor for rows another rank holds;
* ``missing``: rank 1's loader leaves one parameter unfilled;
* ``cat``: rank 1's loader runs ``list(map(load_one, weights))`` and ``load_one`` puts a window in
  ``torch.cat`` (which once raised a bare StopIteration there, silently ending the map: 0 weights);
* ``unconsumed``: both loaders skip one tensor and report no loaded set (vLLM does not for a
  quantized model): the start must still fail, naming it. Last, and not caught: each rank writes
  its message, waits for the other, then lets the error end the process (a non-zero exit).

argv: CHECKPOINT OUT_DIR. Each rank writes {case: "" or its error message} to OUT_DIR/rank{R}.json.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tpload.integrations.engine import EngineLoad
from tpload.model.errors import LoadError

SPLIT = "model.layers.0.mlp.up_proj.weight"  # column parallel: rank r holds rows [r*n/2, (r+1)*n/2)
FORGOTTEN = "model.layers.1.self_attn.o_proj.weight"


def load_one(name: str, t: torch.Tensor, case: str, rank: int) -> None:
    dim = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0  # row / column parallel
    if name.endswith("norm.weight"):  # replicated
        part = t
    elif case == "cat" and rank == 1 and name == SPLIT:
        part = torch.cat([t, t])  # a window inside a list: refused, never a StopIteration
    else:
        n = t.shape[dim] // 2
        start = 0 if (case, rank, name) == ("outside", 1, SPLIT) else rank * n
        part = t.narrow(dim, start, n)
    torch.empty(part.shape, dtype=part.dtype).copy_(part)


def engine(case: str, rank: int):
    def load_weights(weights) -> set[str] | None:
        if case == "cat":
            return set(map(lambda nt: (load_one(*nt, case, rank), nt[0])[1], weights))
        loaded = set()
        for name, t in weights:
            if case == "unconsumed" and name == FORGOTTEN:
                continue  # a name the engine does not map: dropped without a word
            load_one(name, t, case, rank)
            loaded.add(name)
        if case == "missing" and rank == 1:
            loaded.discard(SPLIT)
        return None if case == "unconsumed" else loaded

    return load_weights


def main() -> None:
    root, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    names = set(json.loads((Path(root) / "model.safetensors.index.json").read_text())["weight_map"])
    said = {}
    for case in ("ok", "outside", "missing", "cat", "unconsumed"):
        extra = {"report": str(out / "report.json")} if case == "ok" else {}
        job = EngineLoad(
            "test",
            root,
            extra,
            group=dist.group.WORLD,
            cpu_group=dist.group.WORLD,
            rank=rank,
            world=world,
            engine_device=torch.device("cpu"),
            log=logging.getLogger("test"),
        )
        try:
            job.run(engine(case, rank), None if case == "unconsumed" else names)
            said[case] = ""
        except LoadError as e:
            said[case] = str(e)
            if case == "unconsumed":
                (out / f"rank{rank}.json").write_text(json.dumps(said))
                dist.barrier()  # both messages written before either process ends
                raise
    (out / f"rank{rank}.json").write_text(json.dumps(said))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

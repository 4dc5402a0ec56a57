"""Run under torchrun: load and release twice in one process, recording memory after each step.

argv: CHECKPOINT OUT_JSON KIND. Host memory is the process's anonymous resident memory
(RssAnon: the arena on the CPU, never the checkpoint's page cache); on CUDA also the
allocator's allocated and reserved bytes.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tpload.model.errors import LoadError


def anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def device_bytes() -> list[int]:
    if not torch.cuda.is_available():
        return [0, 0]
    torch.cuda.synchronize()
    return [torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]


def main() -> None:
    ckpt, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo"
    )  # its buffers are not the load's
    # `import tpload` is lazy, and so are the kernels: their compiler's memory is a first use's,
    # not a buffer, so the baseline is taken after both
    import tpload.api
    import tpload.kernels.compiled  # noqa: F401

    steps = {"baseline": [anon(), *device_bytes()]}
    for i in (1, 2):
        shards = tpload.load(ckpt, kind=kind, progress=False)
        steps[f"load{i}"] = [anon(), *device_bytes()]
        arena = shards.plan.arena_bytes
        shards.release()
        steps[f"release{i}"] = [anon(), *device_bytes()]
        try:
            shards.state_dict()
            steps["usable_after_release"] = True
        except LoadError:
            steps["usable_after_release"] = False
    steps["arena"] = arena
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump(steps, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Run under torchrun: load, then save what this rank serves for the test to compare.

argv: CHECKPOINT OUT_DIR [key=value ...]  (kinds=packed,expanded  groups=2  verify=node)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tpload


def main() -> None:
    ckpt, out = sys.argv[1], Path(sys.argv[2])
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    kinds = opts.get("kinds", "packed").split(",")
    groups = int(opts.get("groups", "1"))
    group = None
    if groups > 1:  # data parallel x tensor parallel: each group loads its own copy
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        size = world // groups
        subgroups = [dist.new_group(list(range(g * size, (g + 1) * size))) for g in range(groups)]
        group = subgroups[rank // size]
    rank = int(__import__("os").environ["RANK"])
    for kind in kinds:
        shards = tpload.load(
            ckpt, kind=kind, group=group, verify=opts.get("verify", "node"), progress=False
        )
        sd = {k: v.cpu().clone() for k, v in shards.state_dict().items()}
        torch.save(sd, out / f"{kind}-rank{rank}.pt")
        (out / f"{kind}-rank{rank}.json").write_text(shards.report.to_json())
        shards.release()
        if group is None and dist.is_initialized():  # load() made a group for the call alone
            raise SystemExit("load() left the process group it made behind")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Worker: the same checkpoint loaded at tp 2, node verification, with small tensors batched
(windows of cut ones included) and then one by one; writes each rank's digests, hashed counts, and
whether every served tensor is byte-identical, to OUT/rankR.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import tpload
from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.planning import batches as batch
from tpload.planning.layout import Layout
from tpload.storage.sharded import ShardedStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit.loading.batch_runs import runs  # noqa: E402  (the reference rule, by the tests)


def _cut_windows_batched(root: Path, rank: int) -> int:
    """Items of this rank's plan that go in batches although their window is a part of the
    tensor."""
    storage = ShardedStorage(root)
    try:
        planner = planner_of(storage.catalogue, choose("auto", root)[0])
        plan = planner.plan(Layout(2), "packed", rank)
        items = plan.items
        return sum(
            1
            for ks, _ in runs(items, "packed", storage, classes=plan.shapes)
            if len(ks) > 1
            for item in map(items.__getitem__, ks)
            if item.weight.rows != (0, item.weight.view[0])
            or item.weight.cols != (0, item.weight.view[1])
        )
    finally:
        storage.close()


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    cut_windows = _cut_windows_batched(root, rank)
    batched = tpload.load(root, tp=2, progress=False, verify="node")
    got = {n: t.clone() for n, t in batched.state_dict().items()}
    first = batched.report.mine
    batched.release()
    batch.SMALL_BYTES = 0  # every tensor on its own
    alone = tpload.load(root, tp=2, progress=False, verify="node")
    second = alone.report.mine
    same = sorted(got) == sorted(alone.state_dict()) and all(
        alone.state_dict()[n].equal(t) for n, t in got.items()
    )
    alone.release()
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "digests": [first.digest, second.digest],
                "hashed": [first.hashed, second.hashed],
                "same": same,
                "cut_windows_batched": cut_windows,
            }
        )
    )


if __name__ == "__main__":
    main()

"""tpload.load() under real torchrun (gloo): every rank's state_dict against an independent reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from .helpers import HERE, poke, tpload_cli, torchrun
from .reference import expected

DUMP = str(HERE / "workers" / "dump.py")


def as_bytes(t: torch.Tensor, rows: int) -> np.ndarray:
    return t.contiguous().view(-1).view(torch.uint8).numpy().reshape(rows, -1)


def check_rank(root: Path, out: Path, tp: int, rank: int, kind: str, group_rank: int | None = None) -> dict:
    got = torch.load(out / f"{kind}-rank{rank}.pt")
    want = expected(root, tp, rank if group_rank is None else group_rank, kind)
    assert set(got) == set(want), set(got) ^ set(want)
    for name, exp in want.items():
        exp_bytes = exp.view(np.uint8).reshape(exp.shape[0], -1)
        np.testing.assert_array_equal(as_bytes(got[name], exp.shape[0]), exp_bytes, err_msg=f"{kind} rank {rank} {name}")
    return json.loads((out / f"{kind}-rank{rank}.json").read_text())


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_rank_serves_exactly_its_windows(small_ckpt: Path, tmp_path: Path, tp: int) -> None:
    run = torchrun(tp, [DUMP, str(small_ckpt), str(tmp_path), "kinds=packed,expanded"])
    assert run.rc == 0, run.text
    for kind in ("packed", "expanded"):
        reports = [check_rank(small_ckpt, tmp_path, tp, r, kind) for r in range(tp)]
        digests = [r["digest"] for r in reports[0]["ranks"]]
        assert len(digests) == tp and all(len(d) == 64 for d in digests)
        assert len(set(digests)) == tp  # every rank holds a different window
        assert all(rep["ranks"] == reports[0]["ranks"] for rep in reports)  # one table on every rank
        # node verification: each official tensor hashed once on this (single) node
        assert sum(r["hashed"] for r in reports[0]["ranks"]) == 62


def test_two_tp2_groups_passed_as_group(small_ckpt: Path, tmp_path: Path) -> None:
    run = torchrun(4, [DUMP, str(small_ckpt), str(tmp_path), "kinds=expanded", "groups=2"], timeout=180)
    assert run.rc == 0, run.text
    reports = [check_rank(small_ckpt, tmp_path, 2, r, "expanded", group_rank=r % 2) for r in range(4)]
    assert [len(r["ranks"]) for r in reports] == [2, 2, 2, 2]  # ranks counted inside each group
    assert reports[0]["ranks"][0]["digest"] == reports[2]["ranks"][0]["digest"]  # same copy, same digest
    assert reports[0]["ranks"][0]["digest"] != reports[0]["ranks"][1]["digest"]


def digests(run_dir: Path, root: Path, name: str) -> list[str]:
    report = run_dir / f"{name}.json"
    run = tpload_cli(2, "--checkpoint", str(root), "--report", str(report))
    assert run.rc == 0, run.text
    return [r["digest"] for r in json.loads(report.read_text())["ranks"]]


def test_digests_are_stable_and_follow_one_byte(ckpt_copy: Path, tmp_path: Path) -> None:
    first, second = digests(tmp_path, ckpt_copy, "a"), digests(tmp_path, ckpt_copy, "b")
    assert first == second
    # a legitimately different checkpoint: one byte of rank 1's half of a w1, manifest re-hashed
    poke(ckpt_copy, "mtp.0.ffn.experts.5.w1.weight", 200 * 128 + 7, fix_manifest=True)
    third = digests(tmp_path, ckpt_copy, "c")
    assert third[0] == first[0] and third[1] != first[1]

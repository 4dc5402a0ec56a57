"""Expert parallel and tp x ep under real torchrun: the reference model's tp 8 is impossible,
tp 4 x ep 2 works, each rank reads (and hashes) only the experts its group holds, and MTP
experts can be configured as replicated."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.tools.synth import SynthSpec, write_checkpoint

from ..ckpt_tools import config_with, serve
from ..helpers import load_error, tpload_cli
from ..reference import expected

EXPERT = re.compile(r"\.experts\.(\d+)\.")


@pytest.fixture(scope="module")
def ref_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference model's channels (I = 2304: 288 per rank at tp 8, not a multiple of 64)."""
    return write_checkpoint(
        tmp_path_factory.mktemp("ref"), SynthSpec(hidden=256, inter=2304, experts=4, vocab=64)
    )


def experts_of(names: list[str]) -> set[int]:
    return {int(m.group(1)) for n in names if (m := EXPERT.search(n))}


@pytest.mark.slow
def test_tp8_is_refused_on_every_rank_and_suggests_tp4_ep2(ref_ckpt: Path, tmp_path: Path) -> None:
    run = tpload_cli(8, "--checkpoint", str(ref_ckpt), logs=tmp_path / "logs", timeout=300)
    assert run.rc != 0
    _, msg = load_error(run)  # one rank prints it; the other seven point to it
    assert "2304 channels / tp 8 = 288, not a multiple of 64" in msg
    assert "--tp 4 --ep 2" in msg


def test_ep2_ranks_read_and_hash_only_the_experts_they_hold(
    small_ckpt: Path, tmp_path: Path
) -> None:
    docs = serve(small_ckpt, tmp_path, 2, tp="1", ep="2")
    ranks = docs[0]["report"]["ranks"]
    for rank, doc in enumerate(docs):
        held = set(range(4 * rank, 4 * rank + 4))  # ep group g holds experts [g*E/ep, (g+1)*E/ep)
        assert experts_of(doc["names"]) == held
        assert (
            experts_of(doc["hashed"]) <= held
        )  # node hashing never touches another group's expert
        want = {
            n: a
            for n, a in expected(small_ckpt, 1, 0, "packed").items()
            if not EXPERT.search(n) or experts_of([n]) <= held
        }
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert set(got) == set(want)
        for name, arr in want.items():
            assert (
                got[name].contiguous().view(torch.uint8).numpy().tobytes()
                == np.ascontiguousarray(arr).tobytes()
            ), name
        assert ranks[rank]["bytes_read"] == sum(a.nbytes for a in want.values())
    assert ranks[0]["digest"] != ranks[1]["digest"]


@pytest.mark.slow
def test_tp4_ep2_on_8_ranks_reads_only_held_experts(ref_ckpt: Path, tmp_path: Path) -> None:
    docs = serve(ref_ckpt, tmp_path, 8, tp="4", ep="2")
    ranks = docs[0]["report"]["ranks"]
    assert (docs[0]["report"]["tp"], docs[0]["report"]["ep"]) == (4, 2)
    for rank, doc in enumerate(docs):
        group, tpr = divmod(rank, 4)
        held = {2 * group, 2 * group + 1}  # ep group g holds experts [g*E/ep, (g+1)*E/ep)
        assert experts_of(doc["names"]) == held
        assert (
            experts_of(doc["hashed"]) <= held
        )  # node hashing never touches another group's expert
        want = {
            n: a
            for n, a in expected(ref_ckpt, 4, tpr, "packed").items()
            if not EXPERT.search(n) or experts_of([n]) <= held
        }
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert set(got) == set(want)
        for name, arr in want.items():
            assert (
                got[name].contiguous().view(torch.uint8).numpy().tobytes()
                == np.ascontiguousarray(arr).tobytes()
            ), name
        assert ranks[rank]["bytes_read"] == sum(a.nbytes for a in want.values())
    # ranks with the same tp position in different ep groups hold different experts
    assert len({r["digest"] for r in ranks}) == 8


@pytest.mark.slow
def test_mtp_experts_replicated_by_config(tmp_path: Path, small_ckpt: Path) -> None:
    config = config_with(
        tmp_path,
        """
[[rules]]
match = "mtp.*.ffn.experts.*.w[13].weight"
role = "fp4"
split = "rows"
experts = false

[[rules]]
match = "mtp.*.ffn.experts.*.w2.weight"
role = "fp4"
split = "cols"
experts = false
""",
    )
    docs = serve(small_ckpt, tmp_path / "o", 4, tp="2", ep="2", config=str(config))
    ranks = docs[0]["report"]["ranks"]
    assert all(
        experts_of(d["names"]) == set(range(8)) for d in docs
    )  # every rank holds every expert
    assert ranks[0]["digest"] == ranks[2]["digest"] and ranks[1]["digest"] == ranks[3]["digest"]
    assert ranks[0]["digest"] != ranks[1]["digest"]  # tp still cuts their channels

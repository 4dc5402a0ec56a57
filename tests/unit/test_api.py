"""tpload.load() in one process (a single rank): exact windows against the independent reference,
stable digests, and how it finds its groups and its device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tpload
from tpload.distributed import world as distributed
from tpload.model.errors import OptionsError

from ..helpers import poke
from ..reference import expected


@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_one_rank_serves_exactly_the_reference(small_ckpt: Path, kind: str) -> None:
    shards = tpload.load(small_ckpt, kind=kind, progress=False)
    got, want = shards.state_dict(), expected(small_ckpt, 1, 0, kind)
    assert set(got) == set(want)
    for name, exp in want.items():
        b = got[name].contiguous().view(-1).view(torch.uint8).numpy().reshape(exp.shape[0], -1)
        np.testing.assert_array_equal(b, exp.view(np.uint8).reshape(exp.shape[0], -1), err_msg=name)
    assert (
        shards.hashed == sorted(shards.hashed) and len(shards.hashed) == 62
    )  # one rank hashes all
    if kind == "expanded":
        assert (
            shards.report.mine.sampled == 9
        )  # 4 fp4 + 4 fp8 + the one F16 decode, each independently checked


def test_digests_are_stable_and_follow_one_byte(ckpt_copy: Path) -> None:
    first, second = (tpload.load(ckpt_copy, progress=False).report.mine.digest for _ in range(2))
    assert first == second
    poke(
        ckpt_copy, "mtp.0.ffn.experts.5.w1.weight", 7, fix_manifest=True
    )  # a legitimately different checkpoint
    assert tpload.load(ckpt_copy, progress=False).report.mine.digest != first


def test_served_tensors_are_views_of_one_arena(small_ckpt: Path) -> None:
    sd = tpload.load(small_ckpt, progress=False).state_dict()
    ptrs = sorted(t.data_ptr() for t in sd.values())
    assert all(p % 256 == 0 for p in ptrs)
    head = sd["head.weight"]
    assert head.dtype == torch.bfloat16 and head.is_contiguous() and head.shape == (512, 256)


class _Group:
    """A stand-in for an NCCL-only process group: it has no backend for CPU tensors."""

    def _get_backend(self, device: torch.device) -> object:
        raise RuntimeError("no backend for cpu")


def test_an_nccl_only_group_needs_a_cpu_group() -> None:
    with pytest.raises(OptionsError, match="has no CPU backend .* pass cpu_group="):
        distributed._cpu_group_of(_Group(), None)
    marker = object()
    assert distributed._cpu_group_of(_Group(), marker) is marker


def test_more_ranks_than_gpus_is_refused_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stand-in for a node with 2 GPUs, and LOCAL_RANK 3 (a launcher started 4 ranks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(OptionsError, match="LOCAL_RANK 3 has no GPU of its own \\(2 visible\\)"):
        distributed.pick_device(None, 3)
    assert distributed.pick_device(None, 3, allow_shared=True) == torch.device("cuda", 1)
    assert distributed.pick_device(None, 1) == torch.device(
        "cuda", 1
    )  # LOCAL_RANK, never the global rank
    with pytest.raises(OptionsError, match="cuda:5 asked for, but this process sees 2 GPU"):
        distributed.pick_device("cuda:5", 0)


def test_dir_shows_the_api_not_the_module_s_own_imports() -> None:
    names = dir(tpload)
    assert set(tpload.__all__) <= set(names)
    assert {"load", "LoadError", "LoadOptions", "RankShards"} <= set(names)
    assert not {"sys", "time", "importlib", "TYPE_CHECKING", "annotations"} & set(names)
    assert all(hasattr(tpload, n) for n in names)  # each one resolves (lazily)

"""Derived buffers on RankShards: registered with derive(), freed by release() with the rest, and
counted apart in what release() returns."""

from __future__ import annotations

import pytest
import torch

import tpload
from tpload.model.errors import LoadError
from tpload.tools.published import write_published


def test_derived_buffers_are_freed_with_the_load_and_counted_apart(tmp_path) -> None:
    root = write_published(tmp_path / "llama", "llama-tiny")
    shards = tpload.load(root, progress=False, device="cpu")
    state = shards.state_dict()
    q, k = (
        state["model.layers.0.self_attn.q_proj.weight"],
        state["model.layers.0.self_attn.k_proj.weight"],
    )
    fused = shards.derive("model.layers.0.self_attn.qk_proj.weight", torch.cat([q, k]))
    twin = shards.derive(
        "model.layers.0.self_attn.q_proj.weight.T", q.t()
    )  # a view of the arena: no new bytes
    assert set(shards.derived()) == {
        "model.layers.0.self_attn.qk_proj.weight",
        "model.layers.0.self_attn.q_proj.weight.T",
    }
    assert "model.layers.0.self_attn.qk_proj.weight" not in shards.state_dict()
    with pytest.raises(
        LoadError, match="derive model.layers.0.self_attn.q_proj.weight: a served tensor already"
    ):
        shards.derive("model.layers.0.self_attn.q_proj.weight", twin)
    with pytest.raises(LoadError, match="a derived tensor already has this name"):
        shards.derive("model.layers.0.self_attn.qk_proj.weight", fused)
    freed = shards.release()
    assert freed.tensors == len(state) and freed.bytes == shards.plan.arena_bytes > 0
    assert freed.derived == 2 and freed.derived_bytes == fused.numel() * fused.element_size()
    assert shards.derived() == {} and shards.release().tensors == 0
    with pytest.raises(LoadError, match="released"):
        shards.derive("x", fused)

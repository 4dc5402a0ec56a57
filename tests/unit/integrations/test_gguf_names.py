"""The GGUF hand-off's names and entries without vLLM: the name map as vLLM builds it (gguf's tensor
map, the by-hand stacked-expert entries, transformers 5's fused expert names counted as covered, the
unmapped refused in one line), and on the qwen3-moe-gguf-tiny miniature at tp 2 the sequence vLLM's
GGUF iterator yields (``qweight_type`` then ``qweight``, header order), with windows that serve
vLLM's GGUF narrows (rows; row bytes for row-parallel and down experts) from the bytes gguf's reader
reads, and refuse the other rank's part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.integrations.gguf_names import (
    GGUFHandoff,
    GGUFNameError,
    gguf_arch,
    gguf_name,
    gguf_skips,
    manual_entries,
    weights_map,
)
from tpload.integrations.handed import HandoffError
from tpload.integrations.handoff import element_ranges
from tpload.integrations.skips import Skip, declared_skips
from tpload.integrations.window_tensor import WindowTensor

gguf = pytest.importorskip("gguf")


def qwen3_hf_names(layers: int, *, fused: bool) -> list[str]:
    """transformers' Qwen3-MoE state-dict names (fused experts: transformers 5; per expert: 4)."""
    out = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            p + f"self_attn.{n}.weight"
            for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
        ]
        out += [
            p + "mlp.gate.weight",
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
        ]
        out += (
            [p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj"]
            if fused
            else [
                p + f"mlp.experts.{e}.{n}_proj.weight"
                for e in range(4)
                for n in ("gate", "up", "down")
            ]
        )
    return out


@pytest.mark.parametrize("fused", [True, False])
def test_the_map_is_vllms(fused: bool) -> None:
    names = weights_map("qwen3_moe", 2, qwen3_hf_names(2, fused=fused))
    assert names["blk.1.ffn_down_exps.weight"] == "model.layers.1.mlp.experts.0.down_proj.weight"
    assert names["blk.0.ffn_gate_exps.weight"] == "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert names["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"
    assert names["blk.1.attn_k_norm.weight"] == "model.layers.1.self_attn.k_norm.weight"
    assert names["blk.0.ffn_gate_inp.weight"] == "model.layers.0.mlp.gate.weight"
    assert names["blk.0.ffn_norm.weight"] == "model.layers.0.post_attention_layernorm.weight"
    assert (names["token_embd.weight"], names["output.weight"], names["output_norm.weight"]) == (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
    )
    assert len({k for k in names if not k.endswith(".")}) == 3 + 12 * 2


def test_deepseek_and_the_spellings() -> None:
    assert (
        gguf_arch("deepseek_v3") == "deepseek2"
        and gguf_arch("qwen2_moe") == "qwen2moe"
        and gguf_arch("llama") == "llama"
    )
    hand = manual_entries("deepseek2", 3)
    assert (
        hand["blk.2.exp_probs_b.bias"] == "model.layers.2.mlp.gate.e_score_correction_bias"
        and len(hand) == 12
    )
    assert manual_entries("llama", 3) == {}
    look = {"model.layers.0.self_attn.q_proj": "blk.0.attn_q", "model.norm": "output_norm"}.get
    assert gguf_name("model.layers.0.self_attn.q_proj.bias", look) == "blk.0.attn_q.bias"
    assert gguf_name("language_model.model.norm.weight", look) == "output_norm.weight"
    assert gguf_name("model.norm_weight", look) == "output_norm.weight"  # Gemma3's spelling
    assert gguf_name("model.other.weight", look) is None


def test_unmapped_parameters_are_refused_in_one_line() -> None:
    hf = qwen3_hf_names(1, fused=True) + ["model.layers.0.mlp.mystery.weight", "model.extra.weight"]
    with pytest.raises(GGUFNameError) as e:
        weights_map("qwen3_moe", 1, hf)
    assert str(e.value) == (
        "GGUF hand-off: 2 parameter(s) of the qwen3_moe model have no GGUF name in gguf's qwen3moe "
        "tensor map: model.layers.0.mlp.mystery.weight, model.extra.weight"
    )


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tpload.tools.synth_gguf import write_gguf_preset

    return write_gguf_preset(tmp_path_factory.mktemp("g") / "q3", "qwen3-moe-gguf-tiny")


def _tp2(root: Path, rank: int) -> tuple[dict, list, dict[str, np.ndarray]]:
    """The rank's plan, its windows cut from gguf's reader (not tpload's), and gguf's whole
    tensors."""
    from tpload.loading.pick import choose
    from tpload.loading.planner import planner_of
    from tpload.planning.layout import Layout
    from tpload.storage.catalogue import read_native

    whole = {
        t.name: np.asarray(t.data)
        for f in sorted(root.glob("*.gguf"))
        for t in gguf.GGUFReader(f).tensors
    }
    config, _ = choose("auto", root)
    plan = planner_of(read_native(root)[0], config).plan(Layout(2), "packed", rank)
    state = {}
    for item in plan.items:
        for c in item.cuts:
            held = element_ranges(c, item.fit.weight)
            state[c.name] = torch.from_numpy(
                np.array(whole[c.name][tuple(slice(a, b) for a, b in held)])
            )
    return state, plan.items, whole


def test_the_handoff_yields_vllms_entries_and_serves_its_narrows(qwen3: Path) -> None:
    hf = qwen3_hf_names(2, fused=True)
    names = weights_map("qwen3_moe", 2, hf)
    state, items, whole = _tp2(qwen3, 1)
    handoff = GGUFHandoff(state, items, rank=1, names=names)
    got = list(handoff.tensors())
    order = [t.name for f in sorted(qwen3.glob("*.gguf")) for t in gguf.GGUFReader(f).tensors]
    types = {
        t.name: t.tensor_type
        for f in sorted(qwen3.glob("*.gguf"))
        for t in gguf.GGUFReader(f).tensors
    }
    expected = []
    for g in order:
        n = names[g]
        if types[g].name != "F32":
            expected += [n.replace("weight", "qweight_type"), n.replace("weight", "qweight")]
        else:
            expected.append(n)
    assert [n for n, _ in got] == expected
    back = {v: k for k, v in names.items()}
    for n, t in got:
        if n.endswith("qweight_type"):
            g = back[n.replace("qweight_type", "weight")]
            assert t.dtype == torch.int64 and t.dim() == 0 and int(t) == int(types[g])
            continue
        g = back[n.replace("qweight", "weight")]
        ref = torch.from_numpy(np.array(whole[g]))
        assert tuple(t.shape) == tuple(ref.shape) and t.dtype == ref.dtype, n
        if not isinstance(t, WindowTensor):
            assert torch.equal(t, ref), n
            continue
        # vLLM's GGUF loaders: row-parallel layers and down experts narrow the row bytes, the rest
        # rows
        dim = t.dim() - 1 if ("o_proj" in n or "down_proj" in n) else t.dim() - 2
        size = t.shape[dim] // 2
        assert torch.equal(t.narrow(dim, size, size), ref.narrow(dim, size, size)), n
        with pytest.raises(HandoffError, match="this rank holds"):
            t.narrow(dim, 0, size)
    assert handoff.unconsumed()[0] == []


def test_a_tensor_vllm_has_no_name_for_is_refused(qwen3: Path) -> None:
    names = weights_map("qwen3_moe", 2, qwen3_hf_names(2, fused=True))
    del names["blk.1.attn_v.weight"]
    state, items, _ = _tp2(qwen3, 0)
    with pytest.raises(
        HandoffError,
        match=r"1 tensor\(s\) of the checkpoint have no name in vLLM's GGUF map for this "
        r"model, and vLLM would drop them unloaded: blk.1.attn_v.weight$",
    ):
        GGUFHandoff(state, items, rank=0, names=names)


def test_mtp_skips_become_gguf_blocks_where_the_set_has_them(qwen3: Path, tmp_path: Path) -> None:
    # vLLM's DeepSeek-V3 config declares an MTP layer after the main ones; a GGUF set names it blk.N
    skips = declared_skips(
        {"num_hidden_layers": 1, "num_nextn_predict_layers": 2, "tie_word_embeddings": True}
    )
    got = gguf_skips(skips, str(qwen3))
    assert [(s.glob, s.read) for s in got if not s.read] == [
        ("blk.1.*", False)
    ]  # blk.2 is not in the set: dropped
    assert [s.glob for s in got if s.read] == [s.glob for s in skips if s.read]
    assert gguf_skips(skips, str(tmp_path)) == skips  # not a GGUF folder: as declared
    assert (
        gguf_skips((Skip("model.layers.1.*", "x", read=True),), str(qwen3))[0].glob
        == "model.layers.1.*"
    )

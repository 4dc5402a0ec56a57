"""The KV-cache scale census (tpload/kvscales.py): every spelling per layer, the canonical (vLLM)
names, what a strict config refuses and a report config says, on name lists and a real checkpoint
with three spellings in one census."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tpload
from tpload.config import load_config
from tpload.errors import LoadError
from tpload.kvscales import census
from tpload.tools.published import write_published

from ..ckpt_tools import renamed, repin

L = "model.layers.{}.self_attn."
SPELLED = {  # layer: its stored k and v scale names
    0: [L + "k_scale", L + "v_scale"],
    1: [L + "k_proj.output_scale", L + "v_proj.output_scale"],
    2: [L + "k_proj.k_scale", L + "v_proj.v_scale"],
    3: [L + "kv_scale"],
    4: [L + "qkv_proj.k_scale", L + "qkv_proj.v_scale"],
}


def scale_names(layers: dict[int, list[str]]) -> list[str]:
    return [n.format(i) for i, ns in layers.items() for n in ns]


def attention(n: int) -> list[str]:
    return [L.format(i) + "q_proj.weight" for i in range(n)]


def test_every_spelling_is_found_with_its_canonical_name() -> None:
    c = census(
        attention(6)
        + scale_names(SPELLED)
        + ["blk.5.attn_k_scale", "blk.5.attn_v_scale", "blk.5.attn_q.weight"]
    )
    assert [s.stem for s in c.layers.values()] == ["blk.5."] + [
        f"model.layers.{i}." for i in range(5)
    ]
    assert len({s.spellings[0] for s in c.layers.values()}) == 6
    for s in c.layers.values():
        assert s.k and s.v and len(s.spellings) == 1
    names = c.engine_names()
    assert names["model.layers.1.self_attn.k_proj.output_scale"] == (
        "model.layers.1.self_attn.attn.k_scale",
    )
    assert names["model.layers.3.self_attn.kv_scale"] == (
        "model.layers.3.self_attn.attn.k_scale",
        "model.layers.3.self_attn.attn.v_scale",
    )
    assert names["blk.5.attn_v_scale"] == ("model.layers.5.self_attn.attn.v_scale",)
    # the attention layer 5 of the model.layers spelling has no scales: said, naming it
    assert c.problems() == ["kv-cache scales on 6 of 7 attention layers; none on model.layers.5."]


def test_half_doubled_and_partial_layers_are_each_named() -> None:
    c = census(
        attention(4)
        + [
            L.format(0) + "k_scale",
            L.format(0) + "v_scale",
            L.format(1) + "k_scale",
            L.format(2) + "k_scale",
            L.format(2) + "v_scale",
            L.format(2) + "k_proj.output_scale",
            L.format(2) + "v_proj.output_scale",
        ]
    )
    problems = c.problems()
    assert (
        problems[0] == "kv-cache scales: 1 layer(s) with one of k and v: model.layers.1. (k only)"
    )
    assert problems[1].startswith(
        "kv-cache scales: 1 layer(s) spelled two ways: model.layers.2. (self_attn.{k,v}_scale and"
    )
    assert problems[2] == "kv-cache scales on 3 of 4 attention layers; none on model.layers.3."
    assert census(attention(2)).problems() == [] and not census(attention(2))


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-tiny with a third layer (layer 1's tensors again) and FP8 KV scales in three
    spellings."""
    base = tmp_path_factory.mktemp("kv")
    plain = write_published(base / "plain", "llama-tiny")
    layer1 = {}
    for f in plain.glob("*.safetensors"):
        layer1.update(
            {
                n.replace(".1.", ".2.", 1): t
                for n, t in load_file(str(f)).items()
                if n.startswith("model.layers.1.")
            }
        )
    scales = {
        n: torch.tensor(0.25 * (i + 1), dtype=torch.float32)
        for i, n in enumerate(scale_names({k: SPELLED[k] for k in (0, 1, 2)}))
    }
    root = renamed(plain, base / "three", lambda n: n, extra={**layer1, **scales})
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    repin(root)
    return root


def test_three_spellings_in_one_census_load_under_their_stored_names(three: Path) -> None:
    shards = tpload.load(three, progress=False, device="cpu")
    state = shards.state_dict()
    assert state["model.layers.1.self_attn.k_proj.output_scale"].item() == pytest.approx(0.75)
    assert "model.layers.1.self_attn.attn.k_scale" not in state  # served as stored
    doc = shards.report.kv_scales
    assert doc["attention_layers"] == 3 and len(doc["layers"]) == 3
    assert len({s["spellings"][0] for s in doc["layers"]}) == 3
    assert doc["layers"][2]["k"] == ["model.layers.2.self_attn.k_proj.k_scale"]
    assert doc["layers"][2]["vllm"]["v"] == "model.layers.2.self_attn.attn.v_scale"
    line = next(
        n for n in shards.report.notes if n.startswith("kv-cache scales: 3 of 3 attention layers")
    )
    assert "(ModelOpt) on 1 layer(s) (layer 2; k on 1, v on 1)" in line
    shards.release()


def test_a_broken_census_is_refused_or_reported_by_the_config(three: Path, tmp_path: Path) -> None:
    broken = renamed(
        three,
        tmp_path / "broken",
        lambda n: n,
        extra={"model.layers.2.self_attn.k_scale": torch.tensor(1.0)},
    )  # layer 2 spelled twice
    with pytest.raises(
        LoadError,
        match=r"1 layer\(s\) spelled two ways: model\.layers\.2\. .*\(refused: set "
        r"kv_scales = \"report\"",
    ):
        tpload.load(broken, progress=False, device="cpu")
    text = (
        'kv_scales = "report"\n'
        + (Path(tpload.__file__).parent / "configs" / "llama.toml").read_text()
    )
    (tmp_path / "report.toml").write_text(text)
    assert load_config(tmp_path / "report.toml").kv_scales == "report"
    shards = tpload.load(broken, progress=False, device="cpu", config=str(tmp_path / "report.toml"))
    assert any(
        "spelled two ways: model.layers.2." in n and "(reported" in n for n in shards.report.notes
    )
    shards.release()

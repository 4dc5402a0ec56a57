"""The KV-cache scale census (tpload/selection/kvscales.py): every spelling per layer, the canonical
(vLLM) names, what a strict config refuses and a report config says, on name lists and a real
checkpoint with three spellings in one census."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tpload
from tpload.model.errors import LoadError
from tpload.selection.config import load_config
from tpload.selection.kvscales import census
from tpload.tools.published import write_published

from ...ckpt_tools import renamed, repin

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
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("kv") / "plain", "llama-tiny")


def with_scales(plain: Path, root: Path, **given: torch.Tensor) -> Path:
    """llama-tiny with a third layer (layer 1's tensors again) and FP8 KV scales in three
    spellings (0.25, 0.5 ...; ``given``: a scale's tensor instead, by its name with dots as
    ``__``)."""
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
        n: given.get(n.replace(".", "__"), torch.tensor(0.25 * (i + 1), dtype=torch.float32))
        for i, n in enumerate(scale_names({k: SPELLED[k] for k in (0, 1, 2)}))
    }
    root = renamed(plain, root, lambda n: n, extra={**layer1, **scales})
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    repin(root)
    return root


@pytest.fixture(scope="module")
def three(plain: Path) -> Path:
    return with_scales(plain, plain.parent / "three")


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


def test_the_census_counts_only_the_layers_a_load_serves(three: Path, tmp_path: Path) -> None:
    """A vision tower's attention and an MTP extra layer hold no KV scales: refused while they are
    served (named), counted out once --skip removes them (no config to write)."""
    bf16 = torch.zeros(4, 4, dtype=torch.bfloat16)
    root = renamed(
        three,
        tmp_path / "vt",
        lambda n: n,
        extra={
            "vision_tower.encoder.layers.0.self_attn.q_proj.weight": bf16,
            "model.layers.3.self_attn.q_proj.weight": bf16.clone(),  # past num_hidden_layers 3
        },
    )
    with pytest.raises(
        LoadError,
        match=r"kv-cache scales on 3 of 5 attention layers; none on model\.layers\.3\., "
        r"vision_tower\.encoder\.layers\.0\. \(refused",
    ):
        tpload.load(root, progress=False, device="cpu")
    with pytest.raises(LoadError, match=r"3 of 4 attention layers; none on model\.layers\.3\. "):
        tpload.load(root, progress=False, device="cpu", skip="vision_tower.*")
    shards = tpload.load(
        root, progress=False, device="cpu", skip=["vision_tower.*", "model.layers.3.*"]
    )
    assert shards.report.kv_scales["attention_layers"] == 3
    assert any(
        n.startswith("kv-cache scales: 3 of 3 attention layers") for n in shards.report.notes
    )
    assert "vision_tower.encoder.layers.0.self_attn.q_proj.weight" not in shards.state_dict()
    shards.release()


@pytest.mark.parametrize("value", [float("nan"), -1.0, 0.0, float("inf"), -0.0])
def test_a_kv_scale_that_is_not_finite_and_positive_is_refused_in_every_mode(
    plain: Path, tmp_path: Path, value: float
) -> None:
    """vLLM divides by a KV scale: NaN, 0, a negative or an infinity is refused naming the tensor
    and the value, whatever the verify mode (off included) and kind, as the FP8 scale checks are."""
    from tpload.cli import main

    name = "model.layers.1.self_attn.k_proj.output_scale"
    bad = with_scales(plain, tmp_path / "bad", **{name.replace(".", "__"): torch.tensor(value)})
    said = rf"tensor {re.escape(name)} \(.*\): 1 KV-cache scale value\(s\) not finite and > 0 " + (
        rf"\(first: {re.escape(f'{value:g}')}; an engine divides by it: a scale must be a finite "
        r"number > 0\) in this rank's window"
    )
    for verify, kind in (("node", "packed"), ("rank", "expanded"), ("off", "packed")):
        with pytest.raises(LoadError, match=said):
            tpload.load(bad, progress=False, device="cpu", verify=verify, kind=kind)
    # plan --write (whose digests --verify digest trusts) and verify at rest refuse it too
    assert main(["plan", str(bad), "--tp", "1", "--write"]) == 1
    assert main(["verify", str(bad)]) == 1


def test_a_kv_scale_changed_behind_its_stored_digests_is_refused_by_value(
    three: Path, tmp_path: Path
) -> None:
    """--verify digest hashes nothing: a scale rewritten in place to NaN after `plan --write`
    (size and mtime restored) is refused by its value, beside the digest that differs."""
    import shutil

    from tpload.cli import main

    root = tmp_path / "ck"
    shutil.copytree(three, root)
    store = tmp_path / "store"
    assert main(["plan", str(root), "--tp", "1", "--write", "--digest-store", str(store)]) == 0
    name = "model.layers.2.self_attn.v_proj.v_scale"
    shard = root / "extra-0.safetensors"
    before = shard.stat()
    with open(shard, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        begin, _ = json.loads(f.read(size))[name]["data_offsets"]
        f.seek(8 + size + begin)
        f.write(torch.tensor(float("nan")).numpy().tobytes())
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # the stamp as plan --write saw it
    with pytest.raises(LoadError) as e:
        tpload.load(root, progress=False, device="cpu", verify="digest", digest_store=str(store))
    assert f"tensor {name} (extra-0.safetensors): 1 KV-cache scale value(s) not finite" in str(
        e.value
    )


def test_kv_scale_values_in_bf16_and_f16_are_checked_and_good_ones_pass(
    plain: Path, three: Path, tmp_path: Path
) -> None:
    name = "model.layers.0.self_attn.v_scale"
    for dtype in (torch.bfloat16, torch.float16):
        bad = with_scales(
            plain,
            tmp_path / str(dtype),
            **{name.replace(".", "__"): torch.tensor(-2.0, dtype=dtype)},
        )
        with pytest.raises(LoadError, match=rf"{re.escape(name)} .*\(first: -2; "):
            tpload.load(bad, progress=False, device="cpu")
    shards = tpload.load(three, progress=False, device="cpu", verify="off")  # 0.25 ... 1.5: fine
    assert shards.state_dict()[name].item() == pytest.approx(0.5)
    shards.release()

"""Published-layout presets (tpload/tools/published.py), read back with the ``safetensors`` library,
not tpload.

* every tiny preset writes a loadable folder: config.json, an index listing every tensor of the
  shards (and only those), a manifest whose sha256s are those of the bytes, ``total_size``;
* each family's header dtypes and shapes as docs/formats/ tabulate them: DeepSeek-V3 F8_E4M3 with
  F32 ``weight_scale_inv`` on 128-blocks (ceiling), gpt-oss ``_blocks``/``_scales``, NVFP4's
  U8 + E4M3 + F32 scalar, Qwen3 FP8 scales, DeepSeek-V4 FP8 + E8M0 and FP4 experts;
* the ``full`` sizes: tensor counts without writing a file, and a headers-only gpt-oss-full written
  as sparse files (tiny on disk) that load, verify and manifest refuse at once while plan cuts it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import tpload
from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.model.errors import CheckpointError
from tpload.planning.layout import Layout
from tpload.storage.catalogue import read_native
from tpload.tools.offline import verify_checkpoint, write_manifest
from tpload.tools.published import PUBLISHED, tensor_count, write_published

TINY = [
    "deepseek-v3-tiny",
    "deepseek-v4-tiny",
    "gpt-oss-tiny",
    "qwen3-fp8-tiny",
    "nvfp4-tiny",
    "llama-tiny",
    "deepseek-v3-bf16-tiny",
]
ITEM = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def headers(root: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """{tensor: (dtype, shape, file)} from every shard, by the safetensors library (no data
    read)."""
    out = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118  a safe_open handle is no mapping: keys() is how it lists its tensors
                s = f.get_slice(name)
                assert name not in out, f"{name} in two shards"
                out[name] = (s.get_dtype(), tuple(s.get_shape()), path.name)
    return out


def disk_bytes(root: Path) -> int:
    """Bytes the folder's files take on disk (allocated blocks, as du counts them)."""
    return sum(p.stat().st_blocks * 512 for p in root.iterdir())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("published")
    return {name: write_published(base / name, name) for name in TINY}


@pytest.fixture(scope="module")
def gpt_oss_full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("full") / "gpt-oss-full", "gpt-oss-full")


# -- every tiny preset: a loadable folder


@pytest.mark.parametrize("name", TINY)
def test_tiny_folder_has_config_index_and_manifest_of_every_tensor(
    tiny: dict[str, Path], name: str
) -> None:
    root = tiny[name]
    config = json.loads((root / "config.json").read_text())
    assert config == PUBLISHED[name]().config
    assert config["architectures"] and config["model_type"]
    found = headers(root)
    count, nbytes = tensor_count(name)
    assert len(found) == count
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: file for n, (_, _, file) in found.items()}
    total = sum(ITEM[d] * math.prod(s) for d, s, _ in found.values())
    assert index["metadata"]["total_size"] == total == nbytes
    manifest = json.loads((root / "NATIVE_MANIFEST.json").read_text())["tensors"]
    assert set(manifest) == set(found)
    for n, (dtype, shape, file) in found.items():
        assert (manifest[n]["file"], manifest[n]["dtype"], tuple(manifest[n]["shape"])) == (
            file,
            dtype,
            shape,
        )


@pytest.mark.parametrize("name", ["deepseek-v3-tiny", "nvfp4-tiny", "gpt-oss-tiny"])
def test_tiny_manifest_sha256_is_that_of_the_stored_bytes(tiny: dict[str, Path], name: str) -> None:
    root = tiny[name]
    manifest = json.loads((root / "NATIVE_MANIFEST.json").read_text())["tensors"]
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for n in f.keys():  # noqa: SIM118  a safe_open handle is no mapping: keys() is how it lists its tensors
                data = f.get_tensor(n).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                assert hashlib.sha256(data).hexdigest() == manifest[n]["sha256"], n


def test_nothing_but_the_expected_files(tiny: dict[str, Path]) -> None:
    for name, root in tiny.items():
        files = {p.name for p in root.iterdir()}
        extra = {"hf_quant_config.json"} if name == "nvfp4-tiny" else set()
        assert (
            files - {p.name for p in root.glob("*.safetensors")}
            == {"config.json", "model.safetensors.index.json", "NATIVE_MANIFEST.json"} | extra
        )
        assert len(list(root.glob("*.safetensors"))) == 2


# -- each family's dtypes and shapes


def _fp8_pairs(found: dict, scale: str) -> list[tuple[str, tuple[int, ...], str, tuple[int, ...]]]:
    """(weight, shape, scale dtype, scale shape) of every F8_E4M3 weight; each must have its
    scale."""
    out = []
    for n, (dtype, shape, _) in found.items():
        if dtype == "F8_E4M3" and n.endswith(".weight"):
            s = n[: -len(".weight")] + scale
            assert s in found, f"{n} has no {scale}"
            out.append((n, shape, found[s][0], found[s][1]))
    return out


def test_deepseek_v3_fp8_weights_have_f32_128_block_scales(tiny: dict[str, Path]) -> None:
    found = headers(tiny["deepseek-v3-tiny"])
    pairs = _fp8_pairs(found, ".weight_scale_inv")
    assert len(pairs) == sum(1 for d, _, _ in found.values() if d == "F8_E4M3") > 0
    ragged = 0
    for n, (rows, cols), sdtype, sshape in pairs:
        assert sdtype == "F32"
        assert sshape == (cdiv(rows, 128), cdiv(cols, 128)), n
        ragged += rows % 128 != 0 or cols % 128 != 0
    assert ragged > 0  # kv_a_proj_with_mqa: kv_lora_rank + rope rows end in a short block
    scales = {n for n in found if n.endswith(".weight_scale_inv")}
    assert len(scales) == len(pairs)
    assert found["model.embed_tokens.weight"][0] == "BF16" and found["lm_head.weight"][0] == "BF16"
    assert {found[n][0] for n in found if n.endswith("e_score_correction_bias")} == {"F32"}
    norms = [
        n for n in found if ("layernorm" in n or n.endswith("norm.weight")) and ".indexer." not in n
    ]
    assert {found[n][0] for n in norms} == {"BF16"}
    assert (
        found["model.layers.0.self_attn.indexer.k_norm.weight"][0] == "F32"
    )  # V3.2's indexer LayerNorm
    assert (
        found["model.layers.2.eh_proj.weight"][0] == "BF16"
    )  # the MTP layer's projection: no scale


def test_deepseek_v3_bf16_is_all_bf16_or_f32_with_its_mtp_layer(tiny: dict[str, Path]) -> None:
    """The vLLM test model: no quantization anywhere, the dimensions vLLM's CPU MLA takes, one MTP
    layer."""
    root = tiny["deepseek-v3-bf16-tiny"]
    found = headers(root)
    config = json.loads((root / "config.json").read_text())
    assert "quantization_config" not in config and config["kv_lora_rank"] == 512
    assert {d for d, _, _ in found.values()} == {"BF16", "F32"}
    assert not any(n.endswith("_scale_inv") for n in found)
    assert found["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"][1] == (512 + 64, 256)
    assert found["model.layers.2.eh_proj.weight"][1] == (
        256,
        512,
    )  # layer num_hidden_layers: the MTP layer


def test_gpt_oss_experts_are_stacked_u8_blocks_and_scales(tiny: dict[str, Path]) -> None:
    root = tiny["gpt-oss-tiny"]
    c = json.loads((root / "config.json").read_text())
    e, h, i = c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    found = headers(root)
    for layer in range(c["num_hidden_layers"]):
        m = f"model.layers.{layer}.mlp.experts"
        for proj, rows, cols in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):
            assert found[f"{m}.{proj}_blocks"][:2] == ("U8", (e, rows, cols // 32, 16))
            assert found[f"{m}.{proj}_scales"][:2] == ("U8", (e, rows, cols // 32))
            assert found[f"{m}.{proj}_bias"][:2] == ("BF16", (e, rows))
    assert {d for n, (d, _, _) in found.items() if "experts" not in n} == {"BF16"}


def test_nvfp4_weights_scales_and_scalar_global_scales(tiny: dict[str, Path]) -> None:
    root = tiny["nvfp4-tiny"]
    found = headers(root)
    quantized = [n for n, (d, _, _) in found.items() if d == "U8"]
    assert quantized and all(n.endswith(".weight") for n in quantized)
    for n in quantized:
        stem = n[: -len(".weight")]
        out, half_in = found[n][1]
        assert found[f"{stem}.weight_scale"][:2] == ("F8_E4M3", (out, 2 * half_in // 16))
        assert found[f"{stem}.weight_scale_2"][:2] == ("F32", ())
        assert found[f"{stem}.input_scale"][:2] == ("F32", ())
    assert not any(
        d == "F8_E4M3" and not n.endswith(".weight_scale") for n, (d, _, _) in found.items()
    )
    assert not any(".self_attn." in n for n in quantized)  # R1-FP4 keeps attention BF16
    quant = json.loads((root / "hf_quant_config.json").read_text())
    assert (
        quant["quantization"]["quant_algo"] == "NVFP4" and quant["quantization"]["group_size"] == 16
    )
    assert "quantization_config" not in json.loads((root / "config.json").read_text())


def test_qwen3_fp8_weight_scale_inv_shapes_are_block_ceilings(tiny: dict[str, Path]) -> None:
    found = headers(tiny["qwen3-fp8-tiny"])
    pairs = _fp8_pairs(found, ".weight_scale_inv")
    assert pairs
    for n, (out, inp), sdtype, sshape in pairs:
        assert sdtype == "BF16"  # the tiny preset stores Qwen3's BF16 variant
        assert sshape == (cdiv(out, 128), cdiv(inp, 128)), n
    assert any(".mlp.experts." in n for n, *_ in pairs)


def test_deepseek_v4_fp8_with_e8m0_scales_and_fp4_experts(tiny: dict[str, Path]) -> None:
    found = headers(tiny["deepseek-v4-tiny"])
    for n, (rows, cols), sdtype, sshape in _fp8_pairs(found, ".scale"):
        assert sdtype == "F8_E8M0" and sshape == (cdiv(rows, 128), cdiv(cols, 128)), n
    experts = [n for n, (d, _, _) in found.items() if d == "I8"]
    assert experts and all(".ffn.experts." in n for n in experts)
    for n in experts:
        rows, half = found[n][1]
        assert found[n[: -len(".weight")] + ".scale"][:2] == ("F8_E8M0", (rows, 2 * half // 32))


def test_llama_tiny_is_all_bf16_without_quantization(tiny: dict[str, Path]) -> None:
    assert {d for d, _, _ in headers(tiny["llama-tiny"]).values()} == {"BF16"}
    assert "quantization_config" not in json.loads((tiny["llama-tiny"] / "config.json").read_text())


# -- full sizes


def test_deepseek_v3_full_has_the_published_tensor_count_and_bytes() -> None:
    assert tensor_count("deepseek-v3-full") == (
        91_991,
        688_574_839_360,
    )  # docs/formats/deepseek-v3.md


def test_gpt_oss_full_counts() -> None:
    assert tensor_count("gpt-oss-full") == (687, 65_248_815_744)  # docs/formats/gpt-oss.md


def test_full_presets_are_headers_only_and_tiny_ones_are_not() -> None:
    for name, make in PUBLISHED.items():
        assert make().headers_only == name.endswith("-full"), name


def test_gpt_oss_full_headers_only_is_sparse_with_real_headers(gpt_oss_full: Path) -> None:
    root = gpt_oss_full
    apparent = sum(p.stat().st_size for p in root.iterdir())
    assert apparent > 65_248_815_744
    assert disk_bytes(root) < 8 << 20  # holes: a few blocks of headers and index
    found = headers(root)
    assert len(found) == 687
    assert found["model.layers.35.mlp.experts.down_proj_blocks"][:2] == ("U8", (128, 2880, 90, 16))
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert index["metadata"]["tpload_headers_only"] == "1"
    assert index["metadata"]["total_size"] == 65_248_815_744
    assert not (root / "NATIVE_MANIFEST.json").exists()


def test_gpt_oss_full_shards_are_named_zero_based(gpt_oss_full: Path) -> None:
    names = sorted(p.name for p in gpt_oss_full.glob("*.safetensors"))
    assert names == [f"model-{k:05d}-of-00014.safetensors" for k in range(15)]


def _assert_headers_only(e: pytest.ExceptionInfo, root: Path) -> None:
    message = str(e.value)
    assert (
        "headers-only checkpoint" in message and str(root) in message and "tpload plan" in message
    )


def test_load_refuses_headers_only(gpt_oss_full: Path) -> None:
    with pytest.raises(tpload.LoadError) as e:
        tpload.load(gpt_oss_full, progress=False)
    _assert_headers_only(e, gpt_oss_full)
    assert "loading it would read zeros" in str(e.value)


def test_verify_refuses_headers_only(gpt_oss_full: Path) -> None:
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(gpt_oss_full, None)
    _assert_headers_only(e, gpt_oss_full)
    assert "verifying it would read zeros" in str(e.value)


def test_manifest_refuses_headers_only_and_writes_nothing(gpt_oss_full: Path) -> None:
    with pytest.raises(CheckpointError) as e:
        write_manifest(gpt_oss_full)
    _assert_headers_only(e, gpt_oss_full)
    assert not os.path.lexists(gpt_oss_full / "NATIVE_MANIFEST.json")


def test_plan_cuts_the_headers_only_checkpoint_with_vllms_uneven_shares(gpt_oss_full: Path) -> None:
    config, _ = choose("auto", gpt_oss_full)
    assert config.name == "gpt-oss+mxfp4"
    catalogue = read_native(gpt_oss_full)[0]
    assert catalogue.headers_only
    planner = planner_of(catalogue, config)
    assert planner.layout_problems(Layout(4)) == []
    assert planner.layout_problems(Layout(8)) == []
    assert planner.layout_problems(Layout(16))  # the last rank would get no expert channel
    name = "model.layers.0.mlp.experts.down_proj_blocks"
    for rank, channels in enumerate([736, 736, 736, 672]):
        item = next(i for i in planner.plan(Layout(4), "packed", rank).items if i.name == name)
        assert item.weight.shape == (128, 2880, channels // 32, 16)

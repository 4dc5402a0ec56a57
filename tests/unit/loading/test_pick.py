"""``--config auto``: :func:`tpload.loading.pick.choose` picks the config from a checkpoint's
config.json (and hf_quant_config.json) and says why in one line.

Folders are written by hand (config.json only, as the published models spell it) for each family;
then every tiny published preset (real shards, tpload.tools.published) is checked to get the config
that actually classifies and cuts all its tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.model.errors import ConfigError
from tpload.planning.layout import Layout
from tpload.selection.config import Config, shipped_configs
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published

FP8_BLOCK = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "quantization_config": FP8_BLOCK,
}
NVFP4_HF_QUANT = {
    "producer": {"name": "modelopt"},
    "quantization": {"quant_algo": "NVFP4", "group_size": 16},
}


def folder(root: Path, config: dict | None, hf_quant: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (root / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return root


def picked(root: Path, spec: str = "auto") -> tuple[Config, str]:
    config, why = choose(spec, root)
    assert isinstance(config, Config)
    return config, why


@pytest.mark.parametrize(
    "model, hf_quant, name, families, why",
    [
        (
            V3,
            None,
            "deepseek-v3+fp8-block",
            ("fp8-block",),
            "config deepseek-v3+fp8-block: config.json architectures DeepseekV3ForCausalLM; "
            "fp8-block from config.json quant_method fp8, weight_block_size [128, 128]",
        ),
        (
            {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"},
            NVFP4_HF_QUANT,
            "deepseek-v3+nvfp4",
            ("nvfp4",),
            "config deepseek-v3+nvfp4: config.json architectures DeepseekV3ForCausalLM; nvfp4 from "
            "hf_quant_config.json quant_algo NVFP4",
        ),
        (
            {
                "architectures": ["GptOssForCausalLM"],
                "model_type": "gpt_oss",
                "quantization_config": {"quant_method": "mxfp4"},
            },
            None,
            "gpt-oss+mxfp4",
            ("mxfp4",),
            "config gpt-oss+mxfp4: config.json architectures GptOssForCausalLM; mxfp4 from "
            "config.json quant_method mxfp4",
        ),
        (
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "quantization_config": FP8_BLOCK,
            },
            None,
            "qwen3+fp8-block",
            ("fp8-block",),
            "config qwen3+fp8-block: config.json architectures Qwen3MoeForCausalLM; fp8-block "
            "from config.json quant_method fp8, weight_block_size [128, 128]",
        ),
        (
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "torch_dtype": "bfloat16",
            },
            None,
            "llama+bf16",
            ("bf16",),
            "config llama+bf16: config.json architectures LlamaForCausalLM; bf16 (config.json has "
            "no quantization_config)",
        ),
    ],
    ids=["deepseek-v3-fp8", "deepseek-v3-nvfp4", "gpt-oss", "qwen3-moe-fp8", "llama-bf16"],
)
def test_auto_picks_the_architecture_and_the_family(
    tmp_path: Path,
    model: dict,
    hf_quant: dict | None,
    name: str,
    families: tuple[str, ...],
    why: str,
) -> None:
    config, reason = picked(folder(tmp_path / "ckpt", model, hf_quant))
    assert (config.name, config.families) == (name, families)
    assert reason == why
    assert "\n" not in reason


def test_hf_quant_config_wins_over_config_json(tmp_path: Path) -> None:
    # an NVFP4 release whose config.json still carries the FP8 quantization_config it came from
    config, why = picked(folder(tmp_path / "ckpt", V3, NVFP4_HF_QUANT))
    assert config.name == "deepseek-v3+nvfp4" and "hf_quant_config.json" in why


def test_modelopt_nvfp4_in_config_json(tmp_path: Path) -> None:
    model = {
        "architectures": ["LlamaForCausalLM"],
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    }
    config, why = picked(folder(tmp_path / "ckpt", model))
    assert config.name == "llama+nvfp4"
    assert why.endswith("nvfp4 from config.json quant_method modelopt, quant_algo NVFP4")


def test_a_family_the_architecture_ships_with_keeps_its_own_list(tmp_path: Path) -> None:
    # DeepSeek-V4 says fp8 in config.json and stores FP4 experts too: both families
    model = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "quantization_config": {**FP8_BLOCK, "scale_fmt": "ue8m0"},
    }
    config, _ = picked(folder(tmp_path / "ckpt", model))
    assert (config.name, config.families) == ("deepseek-v4+fp8-block+mxfp4", ("fp8-block", "mxfp4"))


def test_a_family_the_architecture_does_not_ship_with_replaces_its_list(tmp_path: Path) -> None:
    # a bf16 Qwen3 (its shipped config lists fp8-block): every weight plain
    model = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    config, _ = picked(folder(tmp_path / "ckpt", model))
    assert (config.name, config.families) == ("qwen3+bf16", ("bf16",))


def test_model_type_alone_finds_the_architecture(tmp_path: Path) -> None:
    config, why = picked(
        folder(tmp_path / "ckpt", {"model_type": "kimi_k2", "quantization_config": FP8_BLOCK})
    )
    assert config.name == "deepseek-v3+fp8-block"
    assert "config.json model_type kimi_k2" in why


def test_an_unknown_architecture_lists_what_ships(tmp_path: Path) -> None:
    root = folder(tmp_path / "ckpt", {"architectures": ["MambaForCausalLM"], "model_type": "mamba"})
    with pytest.raises(ConfigError) as e:
        choose("auto", root)
    message = str(e.value)
    assert "MambaForCausalLM" in message and "mamba" in message
    assert "docs/configs.md" in message
    for name in shipped_configs():
        assert name in message


def test_no_config_json_reads_the_reference_layout(tmp_path: Path) -> None:
    root = folder(tmp_path / "ckpt", None)
    (root / "model.safetensors").write_bytes(b"")  # something to read (an empty folder: refused)
    config, why = picked(root)
    assert config.name == "deepseek-v4-mtp"
    assert (
        why.startswith("config deepseek-v4-mtp: ")
        and "has no config.json" in why
        and "docs/format.md" in why
    )


def test_no_config_json_with_a_family_named_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no config.json to find the architecture in"):
        choose("nvfp4", folder(tmp_path / "ckpt", None))


def test_a_family_named_alone_detects_the_architecture(tmp_path: Path) -> None:
    config, why = picked(folder(tmp_path / "ckpt", V3), "nvfp4")
    assert config.name == "deepseek-v3+nvfp4"
    assert why.endswith("nvfp4 named by --config")


def test_a_config_named_outright_is_loaded_without_a_reason(tmp_path: Path) -> None:
    config, why = picked(folder(tmp_path / "ckpt", V3), "llama")
    assert config.name == "llama" and why == ""
    config, why = picked(folder(tmp_path / "ckpt2", V3), "qwen3-fp8")  # an alias
    assert config.name == "qwen3+fp8-block" and why == ""


@pytest.mark.parametrize(
    "model, hf_quant, words",
    [
        (
            {"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "fp8"}},
            None,
            "per-tensor FP8 (no weight_block_size)",
        ),
        (
            {"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "awq"}},
            None,
            "quant_method 'awq' is not a format tpload serves",
        ),
        (
            {"architectures": ["LlamaForCausalLM"]},
            {"quantization": {"quant_algo": "FP8"}},
            "quant_algo 'FP8' is not a format tpload serves",
        ),
    ],
)
def test_quantization_tpload_does_not_serve_is_refused(
    tmp_path: Path, model: dict, hf_quant: dict | None, words: str
) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        choose("auto", folder(tmp_path / "ckpt", model, hf_quant))


def test_a_config_json_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        choose("auto", root)


# -- the tiny published presets: the picked config fits every tensor


@pytest.mark.parametrize(
    "preset, name",
    [
        ("deepseek-v3-tiny", "deepseek-v3+fp8-block"),
        ("deepseek-v4-tiny", "deepseek-v4+fp8-block+mxfp4"),
        ("gpt-oss-tiny", "gpt-oss+mxfp4"),
        ("qwen3-fp8-tiny", "qwen3+fp8-block"),
        ("nvfp4-tiny", "deepseek-v3+nvfp4"),
        ("llama-tiny", "llama+bf16"),
    ],
)
def test_each_tiny_preset_gets_a_config_that_cuts_it(
    tmp_path: Path, preset: str, name: str
) -> None:
    root = write_published(tmp_path / preset, preset, manifest=False)
    config, why = picked(root)
    assert config.name == name and why.startswith(f"config {name}: ")
    planner = planner_of(read_native(root)[0], config)
    assert planner.layout_problems(Layout(2)) == []
    plan = planner.plan(Layout(2), "packed", 1)
    assert len(plan.items) > 0


def test_architectures_follow_the_lists_order(tmp_path: Path) -> None:
    # a Llama checkpoint listing DeepSeek second: Llama's rules, though deepseek-v3 sorts first
    config, why = picked(
        folder(tmp_path / "a", {"architectures": ["LlamaForCausalLM", "DeepseekV3ForCausalLM"]})
    )
    assert config.name == "llama+bf16" and "architectures LlamaForCausalLM" in why
    config, _ = picked(
        folder(tmp_path / "b", {"architectures": ["DeepseekV3ForCausalLM", "LlamaForCausalLM"]})
    )
    assert config.name.startswith("deepseek-v3+")
    # a name no shipped config is for is passed over; architectures come before model_type
    config, why = picked(
        folder(
            tmp_path / "c", {"architectures": ["Nope", "Qwen3ForCausalLM"], "model_type": "llama"}
        )
    )
    assert config.name == "qwen3+bf16" and "architectures Qwen3ForCausalLM" in why


def test_no_two_shipped_configs_claim_one_name() -> None:
    from tpload.loading.pick import _architectures

    claimed = [n for c in _architectures() for n in c.architectures]
    assert len(claimed) == len(set(claimed)) and claimed


@pytest.mark.parametrize(
    "model, hf_quant, words",
    [
        (
            {"architectures": 5},
            None,
            r"config\.json: architectures must be a list of architecture names, not 5",
        ),
        (
            {"architectures": ["LlamaForCausalLM", 7]},
            None,
            r"config\.json: architectures must be a list",
        ),
        (
            {"model_type": ["llama"]},
            None,
            r"config\.json: model_type must be a name, not \[\"llama\"\]",
        ),
        (
            {"architectures": ["LlamaForCausalLM"]},
            {"quantization": "NVFP4"},
            r"hf_quant_config\.json: quantization must be an object \(with quant_algo\), not "
            r"\"NVFP4\"",
        ),
        (
            {"architectures": ["LlamaForCausalLM"]},
            [1],
            r"hf_quant_config\.json: ModelOpt quantization config is not a JSON",
        ),
        (
            {"architectures": ["LlamaForCausalLM"], "quantization_config": "fp8"},
            None,
            r"config\.json: quantization_config must be an object",
        ),
    ],
)
def test_fields_of_the_wrong_type_are_refused_naming_file_and_field(
    tmp_path: Path, model: dict, hf_quant: object, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        choose("auto", folder(tmp_path / "ckpt", model, hf_quant))


@pytest.mark.parametrize("command", ["plan", "verify", "export"])
@pytest.mark.parametrize(
    "model, hf_quant, words",
    [
        ({"architectures": 5}, None, "config.json: architectures must be"),
        (
            {"architectures": ["LlamaForCausalLM"]},
            {"quantization": "NVFP4"},
            "hf_quant_config.json: quantization must be",
        ),
    ],
)
def test_cli_says_one_line_for_a_field_of_the_wrong_type(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    command: str,
    model: dict,
    hf_quant: dict | None,
    words: str,
) -> None:
    from tpload.cli import main

    root = write_published(tmp_path / "llama", "llama-tiny", manifest=False)
    folder(root, model, hf_quant)
    args = {"plan": ["--tp", "1"], "verify": [], "export": [str(tmp_path / "out"), "--tp", "1"]}[
        command
    ]
    assert main([command, str(root), *args]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and err.startswith("tpload: error: ")
        and words in err
        and "Traceback" not in err
    )


def test_no_config_json_and_another_models_tensors_says_config_json_is_missing(
    tmp_path: Path,
) -> None:
    root = write_published(tmp_path / "llama", "llama-tiny", manifest=False)
    (root / "config.json").unlink()
    with pytest.raises(ConfigError) as e:
        choose("auto", root)
    msg = str(e.value)
    assert (
        "no config.json" in msg and "--config NAME" in msg and "llama" in msg and "rule" not in msg
    )
    for name in shipped_configs():
        assert name in msg
    assert choose("llama", root)[0].name == "llama"  # named outright, it loads as before


def test_a_folder_of_pickles_is_refused_saying_why(tmp_path: Path) -> None:
    root = folder(tmp_path / "bin", {"architectures": ["LlamaForCausalLM"]})
    (root / "pytorch_model-00001-of-00002.bin").write_bytes(b"\x80\x04N.")
    (root / "pytorch_model-00002-of-00002.bin").write_bytes(b"\x80\x04N.")
    import tpload
    from tpload.model.errors import LoadError

    with pytest.raises(LoadError) as e:
        tpload.load(root, progress=False)
    msg = str(e.value)
    assert str(root) in msg and "pytorch_model-00001-of-00002.bin" in msg and "pickle" in msg
    assert "arbitrary code execution" in msg and "safetensors" in msg


def test_the_detect_lists_are_the_configs_own() -> None:
    # picking reads only the shipped TOMLs' [detect] and codecs: what load_config builds of them
    from tpload.loading.pick import _architectures
    from tpload.selection.config import ALIASES, load_config, shipped_configs

    built = [load_config(n) for n in shipped_configs() if n not in ALIASES]
    want = [(c.name, c.architectures, c.families) for c in built if c.architectures]
    assert [(d.name, d.architectures, d.families) for d in _architectures()] == want

"""Which config a checkpoint needs (``--config auto``): its config.json names the architecture, its
quantization files the codec families, and one line says why.

* the architecture: config.json's ``architectures`` or ``model_type`` against each shipped
  config's ``[detect]`` list;
* the families: ``hf_quant_config.json`` (ModelOpt: ``quant_algo`` NVFP4) when present, else
  config.json's ``quantization_config`` (``quant_method`` fp8 with ``weight_block_size``, mxfp4,
  modelopt), else ``bf16``. A family the architecture ships with keeps the architecture's own list
  (DeepSeek-V4 says fp8 and stores FP4 experts too).

No config.json: the reference native layout (docs/format.md). A pre-partitioned export: the config
it was made with. Anything else unknown is an error listing what ships and how to write a config.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from .config import FAMILIES, Config, available, load_config, split_spec
from .errors import ConfigError
from .options import DEFAULT_CONFIG, REFERENCE_CONFIG
from .storage import hub, partitioned
from .storage.files import read_json
from .text import escape_name

AUTO = "auto"


def choose(spec: str, root: Path) -> tuple[Config, str]:
    """The config ``spec`` names for the checkpoint at ``root``, and why ("" when named outright).

    ``auto`` detects both halves; a codec family alone (``nvfp4``) detects the architecture and
    keeps the family; anything else is loaded as named. A pre-partitioned export is loaded with
    the config it records.
    """
    head, families = split_spec(spec)
    if head != AUTO and head not in FAMILIES:
        return load_config(spec), ""
    export_config = partitioned.export_config(root) if root.is_dir() else None
    if export_config is not None:
        if head != AUTO:
            raise ConfigError(f"--config {spec}: a pre-partitioned export is loaded with the config it was made "
                              f"with ({export_config}); pass that, or auto")
        return load_config(export_config), f"config {export_config}: the one this export was made with"
    model = model_config(root)
    if model is None:
        if head != AUTO:
            raise ConfigError(f"--config {spec}: {escape_name(root)} has no config.json to find the architecture in; "
                              f"name it (ARCH+{head}; {available()})")
        return load_config(REFERENCE_CONFIG), (f"config {REFERENCE_CONFIG}: {escape_name(root)} has no config.json, "
                                               "so it is read as tpload's reference native layout (docs/format.md)")
    arch, arch_why = _architecture(model, root)
    if head == AUTO:
        picked, fam_why = _families(model, root)
        if all(f in arch.families for f in picked):
            own = [f for f in arch.families if f not in picked]
            if own:  # the architecture's own list covers what was found, and says more
                fam_why += f"; {'+'.join(own)} from {arch.name}'s own families"
            picked = arch.families or picked
    else:
        picked, fam_why = (head, *families), "named by --config"
    config = load_config(f"{arch.name}+{'+'.join(picked)}")
    return config, f"config {config.name}: {arch_why}; {'+'.join(picked)} {fam_why}"


def model_config(root: Path) -> dict | None:
    """The checkpoint's config.json (checked by its blob name first in a hub snapshot), or None."""
    path = root / "config.json"
    if not path.exists():
        return None
    if hub.is_snapshot(root):  # checked by its blob name before a byte of it is believed
        hub.check_small_files(root)
    doc = read_json(path, "model config")
    if not isinstance(doc, dict):
        raise ConfigError(f"{escape_name(path)}: model config is not a JSON object")
    return doc


@cache
def _architectures() -> tuple[Config, ...]:
    """Every shipped config with a ``[detect]`` list."""
    names = sorted(p.name[:-5] for p in resources.files("tpload.configs").iterdir() if p.name.endswith(".toml"))
    return tuple(c for c in (load_config(n) for n in names) if c.architectures)


def _architecture(model: dict, root: Path) -> tuple[Config, str]:
    said = [a for a in model.get("architectures") or [] if isinstance(a, str)]
    kind = model.get("model_type") if isinstance(model.get("model_type"), str) else None
    for config in _architectures():
        for name in said + ([kind] if kind else []):
            if name in config.architectures:
                field = "architectures" if name in said else "model_type"
                return config, f"config.json {field} {name}"
    raise ConfigError(f"{escape_name(root / 'config.json')}: architectures {said or 'none'}, model_type "
                      f"{kind or 'none'}: no shipped config is for this model ({available()}). Pass --config with "
                      "one whose names fit, or write a TOML config of [[rules]] (docs/configs.md)")


def _families(model: dict, root: Path) -> tuple[tuple[str, ...], str]:
    """The codec families the checkpoint's quantization files name, and where they said it."""
    hf_quant = root / "hf_quant_config.json"
    if hf_quant.exists():
        doc = read_json(hf_quant, "ModelOpt quantization config")
        algo = (doc.get("quantization") or {}).get("quant_algo") if isinstance(doc, dict) else None
        if algo == "NVFP4":
            return ("nvfp4",), "from hf_quant_config.json quant_algo NVFP4"
        raise ConfigError(f"{escape_name(hf_quant)}: quant_algo {algo!r} is not a format tpload serves (NVFP4 is)")
    quant = model.get("quantization_config")
    if not isinstance(quant, dict):
        return ("bf16",), "(config.json has no quantization_config)"
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size")
        if not block:
            raise ConfigError(f"{escape_name(root / 'config.json')}: quantization_config is per-tensor FP8 (no "
                              "weight_block_size); tpload serves block-scaled FP8 (fp8-block)")
        return ("fp8-block",), f"from config.json quant_method fp8, weight_block_size {block}"
    if method == "mxfp4":
        return ("mxfp4",), "from config.json quant_method mxfp4"
    if method == "modelopt" and quant.get("quant_algo") == "NVFP4":
        return ("nvfp4",), "from config.json quant_method modelopt, quant_algo NVFP4"
    raise ConfigError(f"{escape_name(root / 'config.json')}: quantization_config quant_method {method!r} is not a "
                      f"format tpload serves (codec families: {', '.join(FAMILIES)}); name a config with --config")


__all__ = ["AUTO", "DEFAULT_CONFIG", "choose"]

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

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..model.errors import CheckpointError, ConfigError, LoadError, raise_all
from ..model.text import escape_name
from ..model.values import INDEX_NAME, Json, JsonObject
from ..selection.config import (
    FAMILIES,
    Config,
    available,
    load_config,
    shipped_detect,
    split_spec,
)
from ..selection.defaults import REFERENCE_CONFIG
from ..storage import gguf, hub, localdir, partitioned
from ..storage.catalogue import read_native
from ..storage.files import folder_of, parse_json
from ..storage.pins import Pins
from ..storage.safetensors import read_header

if TYPE_CHECKING:
    pass

AUTO = "auto"


def choose(
    spec: str,
    root: Path,
    *,
    pins: Pins | None = None,
    header: gguf.GGUFHeader | None = None,
    names: Callable[[], list[str]] | None = None,
) -> tuple[Config, str]:
    """The config ``spec`` names for the checkpoint at ``root`` (a folder, or a ``.gguf`` file),
    and why ("" when named outright). ``pins``: those of the manifest the caller opened (a load:
    its catalogue's), so the JSON files are checked against that very manifest, not one read again
    later; ``header``: a GGUF checkpoint's first header as the catalogue read and checked it;
    ``names``: the tensor names as the caller's catalogue holds them (else the index or the
    headers are read for them, where a folder without config.json needs them).

    ``auto`` detects both halves; a codec family alone (``nvfp4``) detects the architecture and
    keeps the family; anything else is loaded as named. A pre-partitioned export is loaded with
    the config it records.
    """
    head, families = split_spec(spec)
    if head != AUTO and head not in FAMILIES:
        return load_config(spec), ""
    folder = folder_of(root)
    export_config = partitioned.export_config(root) if root.is_dir() else None
    if export_config is not None:
        if head != AUTO:
            raise ConfigError(
                f"--config {spec}: a pre-partitioned export is loaded with the config it was made "
                f"with ({export_config}); pass that, or auto"
            )
        return load_config(
            export_config
        ), f"config {export_config}: the one this export was made with"
    pins = pins or (Pins.of(folder) if folder.is_dir() else Pins(folder, None, None))
    model = model_config(root, pins=pins, header=header)
    if model is None:
        if head != AUTO:
            raise ConfigError(
                f"--config {spec}: {escape_name(root)} has no config.json to find the "
                f"architecture in; name it (ARCH+{head}; {available()})"
            )
        if not os.path.lexists(folder / INDEX_NAME) and not any(folder.glob("*.safetensors")):
            # nothing to read as any layout (an empty folder, pickles): the storage's own words,
            # before a note on how the folder would be read
            read_native(folder, manifest=False)
        _refuse_other_layouts(root, pins, names)
        return load_config(REFERENCE_CONFIG), (
            f"config {REFERENCE_CONFIG}: {escape_name(root)} has no config.json, "
            "so it is read as tpload's reference native layout (docs/format.md)"
        )
    arch, arch_why = _architecture(model, folder)
    if head == AUTO:
        picked, fam_why = _families(model, folder, pins)
        if all(f in arch.families for f in picked):
            own = [f for f in arch.families if f not in picked]
            if own:  # the architecture's own list covers what was found, and says more
                fam_why += f"; {'+'.join(own)} from {arch.name}'s own families"
            picked = arch.families or picked
    else:
        picked, fam_why = (head, *families), "named by --config"
    config = load_config(f"{arch.name}+{'+'.join(picked)}")
    return config, f"config {config.name}: {arch_why}; {'+'.join(picked)} {fam_why}"


def refuse_other_rules(root: Path, config: Config) -> None:
    """For an export (``root``), ConfigError unless ``config`` (what the load plans by, its skip
    and defer rules included) decides what the export's config did: its rank files hold the
    windows of those rules, and a TOML named by its path may have been edited since. An export
    from before tpload recorded the rules' sha256 is not checked."""
    name, recorded = partitioned.export_rules(root)
    if recorded is None:
        return
    mine = config.rules_sha256()
    if mine != recorded:
        raise ConfigError(
            f"{escape_name(root)}: this export was made with config {escape_name(name)} (rules "
            f"sha256 {escape_name(recorded[:16])}...), but this load plans by config "
            f"{escape_name(config.name)} (rules sha256 {mine[:16]}...): the rules differ (the "
            "config edited since the export, or other --skip/--defer globs); its rank files hold "
            "the windows of the export's rules: load it with those, or export it again"
        )


def choose_pinned(spec: str, root: Path) -> tuple[Config, str]:
    """:func:`choose` for a command that has not opened the checkpoint (``plan``, ``verify``,
    ``export``): the pins first, as a load checks them before it picks (the JSON files against the
    manifest's pins, a GGUF set's key-values against theirs), so an edited architecture key is
    named as the pin it breaks, not as a model no config ships for. CheckpointError listing every
    pin that fails."""
    folder = folder_of(root)
    if not folder.is_dir() or partitioned.export_config(folder) is not None:
        return choose(spec, root)  # no folder (the command says so), or an export's own manifest
    pins = Pins.of(folder)
    problems = pins.problems()
    header = None
    found = gguf.gguf_files(root)
    if found is not None:
        headers = gguf.read_set(found, folder)
        kv = {h.path.relative_to(folder).as_posix(): (h.kv_sha256, h.kv_bytes) for h in headers}
        problems += pins.gguf_problems(kv)
        header = headers[0]
    raise_all(
        CheckpointError,
        problems,
        what="files that do not match their pins in the manifest (checked before a config is "
        "chosen from them)",
    )
    return choose(spec, root, pins=pins, header=header)


def model_config(
    root: Path, *, pins: Pins | None = None, header: gguf.GGUFHeader | None = None
) -> JsonObject | None:
    """The checkpoint's config.json, or None: checked by its blob name first in a hub snapshot (by
    its etag in a local-dir download), and against its pin in the manifest (``pins``: those of the
    manifest on disk now, by default). Without one, a GGUF checkpoint's header stands for it
    (``header``: the one its catalogue read and checked against the manifest's pins; else read
    now): a :class:`~.storage.gguf.HeaderConfig`, which says where each field came from."""
    root = folder_of(file := root)
    path = root / "config.json"
    if pins is None or "config.json" not in pins.given:  # else checked as the storage opened
        if hub.is_snapshot(root) and path.exists():  # by its blob name before a byte is believed
            hub.check_small_files(root)
        elif localdir.is_local_dir(root) and path.exists():  # by its etag, when fresh
            localdir.LocalDir(root).check_small_files()
    raw = (pins or Pins.of(root)).read("config.json", "model config")
    if raw is None:  # a GGUF checkpoint: its header says what config.json would
        return gguf.header_config(header) if header is not None else gguf.model_config(file)
    doc = parse_json(raw, path, "model config")
    if not isinstance(doc, dict):
        raise ConfigError(f"{escape_name(path)}: model config is not a JSON object")
    return doc


def model_for(
    root: Path,
    config: Config,
    *,
    pins: Pins | None = None,
    header: gguf.GGUFHeader | None = None,
) -> JsonObject | None:
    """The checkpoint's config.json for the planner (``Planner(..., model=)``), or None when it has
    none. An unreadable one is an error only when one of ``config``'s rules counts heads by it."""
    try:
        return model_config(Path(root), pins=pins, header=header)
    except LoadError:
        if any(isinstance(r.units, str) for r in config.rules):
            raise
        return None


_REFERENCE_NAMES = ("mtp.", "head.")
"""How the reference layout's tensor names begin (docs/format.md)."""


def _refuse_other_layouts(root: Path, pins: Pins, given: Callable[[], list[str]] | None) -> None:
    """A folder without config.json is read as the reference layout only if it looks like one (some
    tensor under ``mtp.`` or ``head.``): a model whose config.json was left behind gets told that,
    not a rule of the reference config that its tensors fail. Folders it cannot read pass: the
    load's own opening says what is wrong with them."""
    try:
        names = given() if given is not None else _tensor_names(root, pins)
    except LoadError:
        return
    if names and not any(n.startswith(_REFERENCE_NAMES) for n in names):
        example = escape_name(min(names))
        raise ConfigError(
            f"{escape_name(root)}: no config.json, so --config auto cannot tell which model this "
            f"is (its tensors, e.g. {example}, are not tpload's reference layout of "
            "docs/format.md). Copy the model's config.json beside its shards, or name the config "
            f"with --config NAME ({available()})"
        )


def _tensor_names(root: Path, pins: Pins) -> list[str]:
    """The tensor names of a native folder: its index's (checked against its pin), else its shards'
    headers."""
    raw = pins.read(INDEX_NAME, "index")
    if raw is not None:
        doc = parse_json(raw, root / INDEX_NAME, "index")
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        return list(wmap) if isinstance(wmap, dict) else []
    return [n for p in sorted(root.glob("*.safetensors")) for n in read_header(p, p.name)[0]]


@dataclass(frozen=True)
class _Detect:
    """A shipped config's name, the architectures its ``[detect]`` list names, and its own codec
    families (its ``codecs``): what picking needs of it, read without building its rules."""

    name: str
    architectures: tuple[str, ...]
    families: tuple[str, ...]


@cache
def _architectures() -> tuple[_Detect, ...]:
    """Every shipped config with a ``[detect]`` list: read once a process (a fixed set of files in
    the package, not the input's), and only their ``detect`` and ``codecs`` fields; the one picked
    is loaded (and checked) in full by :func:`load_config`, the others' rules are never compiled."""
    return tuple(_Detect(*said) for said in shipped_detect())


def _architecture(model: JsonObject, root: Path) -> tuple[_Detect, str]:
    """The shipped config of the first name config.json gives (``architectures`` in their order,
    then ``model_type``) that one of them is for: the list's order decides, not the shipped configs'
    names."""
    said = _names(model.get("architectures"), root, "architectures", listed=True)
    kind = _names(model.get("model_type"), root, "model_type", listed=False)
    stand_in = model if isinstance(model, gguf.HeaderConfig) else None
    header = stand_in.path if stand_in is not None else None
    for name in said + kind:
        for config in _architectures():
            if name in config.architectures:
                if stand_in is not None:
                    return config, f"{stand_in.source('architectures')} is {name[5:]} ({name})"
                field = "architectures" if name in said else "model_type"
                return config, f"config.json {field} {name}"
    first_kind = kind[0] if kind else None
    what = (
        f"general.architecture {said[0][5:]}"
        if header is not None
        else f"architectures {said or 'none'}, model_type {first_kind or 'none'}"
    )
    raise ConfigError(
        f"{escape_name(header or root / 'config.json')}: {what}: no shipped config is for this "
        f"model ({available()}). Pass --config with one whose names fit, or write a TOML config "
        "of [[rules]] (docs/configs.md)"
    )


def _names(value: Json, root: Path, field: str, *, listed: bool) -> list[str]:
    """config.json's ``architectures`` (a list of names) or ``model_type`` (a name) as a list;
    absent or null is none; anything else is refused naming the field."""
    if value is None:
        return []
    if listed and isinstance(value, list) and all(isinstance(a, str) for a in value):
        return value
    if not listed and isinstance(value, str):
        return [value]
    want = "a list of architecture names" if listed else "a name"
    raise ConfigError(
        f"{escape_name(root / 'config.json')}: {field} must be {want}, not "
        f"{escape_name(json.dumps(value))[:80]}"
    )


def _families(model: JsonObject, root: Path, pins: Pins) -> tuple[tuple[str, ...], str]:
    """The codec families the checkpoint's quantization files name, and where they said it."""
    hf_quant = root / "hf_quant_config.json"
    raw = pins.read("hf_quant_config.json", "ModelOpt quantization config")
    if raw is not None:
        doc = parse_json(raw, hf_quant, "ModelOpt quantization config")
        if not isinstance(doc, dict):
            raise ConfigError(
                f"{escape_name(hf_quant)}: ModelOpt quantization config is not a JSON object"
            )
        quantization = doc.get("quantization")
        if not isinstance(quantization, dict):
            raise ConfigError(
                f"{escape_name(hf_quant)}: quantization must be an object (with quant_algo), not "
                f"{escape_name(json.dumps(quantization))[:80]}"
            )
        algo = quantization.get("quant_algo")
        if algo == "NVFP4":
            return ("nvfp4",), "from hf_quant_config.json quant_algo NVFP4"
        raise ConfigError(
            f"{escape_name(hf_quant)}: quant_algo {algo!r} is not a format tpload serves (NVFP4 is)"
        )
    quant = model.get("quantization_config")
    if quant == {"quant_method": "gguf"}:
        return ("gguf",), "from the GGUF header"
    if quant is None:
        return ("bf16",), "(config.json has no quantization_config)"
    if not isinstance(quant, dict):
        raise ConfigError(
            f"{escape_name(root / 'config.json')}: quantization_config must be an object (with "
            f"quant_method), not {escape_name(json.dumps(quant))[:80]}"
        )
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size")
        if not block:
            raise ConfigError(
                f"{escape_name(root / 'config.json')}: quantization_config is per-tensor FP8 (no "
                "weight_block_size); tpload serves block-scaled FP8 (fp8-block)"
            )
        return ("fp8-block",), f"from config.json quant_method fp8, weight_block_size {block}"
    if method == "mxfp4":
        return ("mxfp4",), "from config.json quant_method mxfp4"
    if method == "modelopt" and quant.get("quant_algo") == "NVFP4":
        return ("nvfp4",), "from config.json quant_method modelopt, quant_algo NVFP4"
    raise ConfigError(
        f"{escape_name(root / 'config.json')}: quantization_config quant_method {method!r} is not "
        f"a format tpload serves (codec families: {', '.join(FAMILIES)}); name a config with "
        "--config"
    )

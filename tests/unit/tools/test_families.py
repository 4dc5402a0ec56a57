"""The published families as data (tpload/configs/presets/*.toml, read by tpload/tools/families.py).

* a tensor list expands in order: groups over a count or an array, ``if``, ``let``, ``use`` with
  ``at``, stems, a tensor's other keys;
* an expression outside the grammar (a call, an attribute, a lambda...) is refused by name when its
  file is read, and one that fails in its scope says which;
* every file in the folder is a writer's, every preset's config.json is detected as the family's
  loading config (its ``loads_as``: the data agree with the configs beside them), and the GGUF
  presets' architectures are their configs'.

That each preset writes the bytes it wrote as Python is checked once, by hand (the branch's note);
tests/unit/tools/test_published.py holds their layouts to docs/formats/.
"""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from typing import Any

import pytest

from tpload.model.errors import ConfigError
from tpload.selection.config import load_config
from tpload.tools import families
from tpload.tools.published import FAMILIES, PUBLISHED
from tpload.tools.synth_gguf import GGUF_PRESETS, HEADERS_ONLY


def entries(text: str) -> tuple[Any, ...]:
    """The list ``tensors = [...]`` of a TOML text, checked and compiled as a file's are."""
    return families.compile_list(tomllib.loads(text)["tensors"], "test")


def listed(text: str, lists: str = "", **scope: Any) -> list[tuple[str, bool, str, tuple]]:
    named = {k: families.compile_list(v, k) for k, v in tomllib.loads(lists).items()}
    found = families.expand(entries(text), {"bf16": "bf16", "fp8": "fp8", **scope}, named)
    return [(t.name, t.stem, t.form, t.shape) for t in found]


def test_a_list_expands_in_order_with_loops_conditions_lets_and_uses() -> None:
    text = """tensors = [
      { name = "embed", as = "bf16", shape = ["vocab", "hidden"] },
      { for = "layer", in = "layers", let = { last = "layer == layers - 1" }, each = [
        { stem = "l.{layer}.q", as = "fp8 if last else bf16", shape = ["hidden", 16] },
        { if = "layer % 2 == 0", use = "norms", at = "l.{layer}" },
      ] },
      { for = "part", in = ["a", "b"], each = [
        { name = "mix.{part}.{vocab // 2}", as = "bf16", shape = [] },
      ] },
    ]"""
    norms = 'norms = [{ name = "{at}.norm", as = "bf16", shape = ["hidden"] }]'
    assert listed(text, norms, vocab=10, hidden=4, layers=3) == [
        ("embed", False, "bf16", (10, 4)),
        ("l.0.q", True, "bf16", (4, 16)),
        ("l.0.norm", False, "bf16", (4,)),
        ("l.1.q", True, "bf16", (4, 16)),
        ("l.2.q", True, "fp8", (4, 16)),
        ("l.2.norm", False, "bf16", (4,)),
        ("mix.a.5", False, "bf16", ()),
        ("mix.b.5", False, "bf16", ()),
    ]


def test_a_tensor_s_other_keys_are_in_its_own_scope_only() -> None:
    text = """tensors = [
      { name = "ids", as = "bf16", shape = [2], below = "experts * 2" },
      { name = "next", as = "bf16", shape = [1] },
    ]"""
    first, second = families.expand(entries(text), {"bf16": "bf16", "experts": 3}, {})
    assert first.scope["below"] == 6 and "below" not in second.scope


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",  # a call
        "hidden.real",  # an attribute
        "(lambda: 1)()",
        "[x for x in range(3)]",
        "(x := 3)",
        "2 ** 1000000",  # a power: no operator but + - * // %
    ],
)
def test_an_expression_outside_the_grammar_is_refused_by_name(source: str) -> None:
    with pytest.raises(ConfigError) as e:  # (a JSON string is a TOML one)
        entries(f'tensors = [{{ name = "w", as = "bf16", shape = [{json.dumps(source)}] }}]')
    assert repr(source) in str(e.value) and "is not allowed" in str(e.value)


def test_a_template_is_held_to_the_grammar_too() -> None:
    with pytest.raises(ConfigError, match="Call is not allowed"):
        entries('tensors = [{ name = "w.{len(vocab)}", as = "bf16", shape = [] }]')


def test_a_name_not_in_scope_says_which_expression() -> None:
    with pytest.raises(ConfigError) as e:
        listed('tensors = [{ name = "w", as = "bf16", shape = ["hiden"] }]', hidden=4)
    assert str(e.value) == "preset data: 'w': name 'hiden' is not defined"
    with pytest.raises(ConfigError, match="list index out of range"):
        listed('tensors = [{ name = "w", as = "bf16", shape = ["r[3]"] }]', r=[1])


def test_a_malformed_entry_is_refused() -> None:
    with pytest.raises(ConfigError, match="a tensor says name"):
        entries('tensors = [{ name = "w", shape = [1] }]')
    with pytest.raises(ConfigError, match="not both"):
        entries('tensors = [{ each = [], use = "x" }]')
    with pytest.raises(ConfigError, match="for with in"):
        entries('tensors = [{ for = "e", each = [] }]')
    with pytest.raises(ConfigError, match="a tensor has no {'iff'}"):  # never a silent extra
        entries('tensors = [{ name = "w", as = "bf16", shape = [1], iff = "False" }]')


def test_every_file_in_the_folder_is_a_writer_s() -> None:
    folder = resources.files("tpload.configs") / families.FOLDER
    files = {p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml")}
    assert files == {*FAMILIES, "gguf"}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_every_preset_is_detected_as_its_family_s_loading_config(name: str) -> None:
    pub = PUBLISHED[name]()
    config = load_config(families.read(pub.family)["loads_as"])
    assert pub.config["architectures"][0] in config.architectures
    assert pub.config["model_type"] in config.architectures


def test_the_gguf_presets_architectures_are_their_configs() -> None:
    archs = families.read("gguf")["archs"]
    presets = {**GGUF_PRESETS, **{n: make for n, (make, _) in HEADERS_ONLY.items()}}
    assert set(presets) == {"deepseek-v3-gguf-tiny", "qwen3-moe-gguf-tiny", "deepseek-r1-gguf-full"}
    for make in presets.values():
        arch, kv, tensors = make()
        assert f"gguf:{arch}" in load_config(archs[arch]["loads_as"]).architectures
        assert all(key.startswith(f"{arch}.") and isinstance(v, int) for key, v in kv.items())
        assert tensors and all(isinstance(d, int) for _, _, shape in tensors for d in shape)


def test_a_file_or_a_preset_saying_what_no_writer_reads_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"preset many-tensors: no \['shard'\]"):
        families.preset("many-tensors", {"shard": 4}, {"shards"})

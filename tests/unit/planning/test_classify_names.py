"""Classification held to what it gave before its two paths became one: the same entries, classes,
scales, experts, skipped and deferred tensors, census, or the same error's words, for every
published and synth preset's names under every shipped config, with skip, defer and
activation-scale rules of each kind of glob, on names made to break templates (leading zeros,
digits in suffixes and globs, ``?``, ``[class]``) and on names with no templates. Each test's
outcomes are one digest (``PINNED``), taken on ``773b668``, where the columns path and the
name-by-name walk were asserted equal on each case (names with no templates: the walk's alone)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tpload.planning.classify as classify
from tpload.loading.pick import choose
from tpload.model.errors import ConfigError
from tpload.model.table import templates
from tpload.planning.templated import Join, first_rules, keyed
from tpload.selection.config import (
    FAMILIES,
    Config,
    Pick,
    Rule,
    load_config,
    shipped_configs,
    with_rules,
)
from tpload.selection.prefix import detect
from tpload.storage.safetensors import HeaderColumns, TableRows, table_of
from tpload.tools.published import PUBLISHED, _index
from tpload.tools.synth import PRESETS, planned_tensors

from .facts import classified_facts

SMALL_PRESETS = [n for n in _index() if not n.endswith(("-full", "-deep"))] + ["gpt-oss-full"]


def _rows(tensors: list[tuple[str, str, tuple[int, ...]]]) -> TableRows:
    """A catalogue's rows of these (name, dtype, shape), as one shard's header gives them."""
    from tpload.storage.safetensors import ITEMSIZE

    sizes = [int(np.prod(s, dtype=np.int64)) * ITEMSIZE[d] for _, d, s in tensors]
    begins = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64).tolist()
    columns = HeaderColumns(
        [n for n, _, _ in tensors], [d for _, d, _ in tensors], [s for _, _, s in tensors],
        begins, sizes,
    )  # fmt: skip
    return TableRows(table_of(["x.safetensors"], [columns]), [Path("x.safetensors")])


def _facts(tensors: TableRows, config: Config, model: dict | None) -> object:
    """Everything a classification gives, or its error's words."""
    try:
        prefix = detect(tensors, wanted=config.rules_prefix, model=model, where="x")
        c = classify.classify(
            tensors,
            config,
            prefix=prefix,
            model=model,
            root="x",
            table=tensors.table,
        )
    except ConfigError as e:
        return ("error", str(e))
    return (
        *classified_facts(c),
        c.units,
        c.census.to_dict(),
        c.census.engine_names(),
    )


def _said(got: object, tmp: object = None) -> str:
    """A classification's facts (:func:`_facts`) as text that does not depend on the process
    (codecs by their class's name) or on the test's folder (``tmp``)."""
    if isinstance(got, tuple) and got[0] != "error":
        facts = list(got)
        facts[7] = [(r, type(codec).__name__, f, s) for r, codec, f, s in facts[7]]
        got = tuple(facts)
    text = repr(got)
    return text.replace(str(tmp), "TMP") if tmp is not None else text


class _Pinned:
    """The outcomes of one test, held to its digest in ``PINNED`` (set TPLOAD_PIN=1 to print
    them instead)."""

    def __init__(self, request: pytest.FixtureRequest, tmp: object = None) -> None:
        self.key, self.tmp, self.said = request.node.name, tmp, []

    def __call__(self, tensors: TableRows, config: Config, model: dict | None) -> object:
        got = _facts(tensors, config, model)
        self.said.append(_said(got, self.tmp))
        return got

    def check(self) -> None:
        got = hashlib.sha256("\n".join(self.said).encode()).hexdigest()[:16]
        if os.environ.get("TPLOAD_PIN"):
            print(f"PIN {self.key!r}: {got!r},")
            return
        assert got == PINNED[self.key], (self.key, got)


PINNED: dict[str, str] = {
    "test_every_kind_of_problem_at_once": "8e4f8832eac767bd",
    "test_each_published_preset_under_each_config[deepseek-v3-tiny]": "e676b16338bf52cd",
    "test_each_published_preset_under_each_config[deepseek-v3-bf16-tiny]": "753b45e36f17900a",
    "test_each_published_preset_under_each_config[deepseek-v4-tiny]": "3c83623a7b9eaf36",
    "test_each_published_preset_under_each_config[gpt-oss-tiny]": "651cb0cfbb5d8f05",
    "test_each_published_preset_under_each_config[qwen3-fp8-tiny]": "7cef58eb84ea2827",
    "test_each_published_preset_under_each_config[nvfp4-tiny]": "2dd4c6984d561360",
    "test_each_published_preset_under_each_config[llama-tiny]": "92013973ae13dc5b",
    "test_each_published_preset_under_each_config[many-tensors]": "fa0094ae2ed5086b",
    # the same tensors dealt to two files in turn: classified as many-tensors is
    "test_each_published_preset_under_each_config[many-tensors-alternating]": "fa0094ae2ed5086b",
    "test_each_published_preset_under_each_config[gpt-oss-full]": "9e92e6945a92d378",
    "test_the_synth_presets": "e513fda9b74f2321",
    "test_full_size_deepseek_v3": "98ebb7ec7d10dd12",
    "test_names_under_another_prefix[deepseek-v3-tiny]": "02ca2ef0efb9202c",
    "test_names_under_another_prefix[nvfp4-tiny]": "829322f381ccba38",
    "test_names_under_another_prefix[qwen3-fp8-tiny]": "f0f4af6eddc1bf61",
    "test_names_that_break_templates[templates-rules0]": "2d3dd7b364de69f1",
    "test_names_that_break_templates[templates-rules1]": "d0c6465149afd28c",
    "test_names_that_break_templates[templates-rules2]": "ff542232fed58f9c",
    "test_names_that_break_templates[templates-rules3]": "b58b80d545a508bf",
    "test_names_that_break_templates[templates-rules4]": "c03c479280f9c0aa",
    "test_names_that_break_templates[templates-rules5]": "b833cc98b3af2c61",
    "test_names_that_break_templates[templates-rules6]": "1b6666ea66ef8565",
    "test_names_that_break_templates[templates-rules7]": "0b5c46849bd01002",
    "test_names_that_break_templates[templates-rules8]": "353dcab09f6145a1",
    "test_names_that_break_templates[none-rules0]": "f8d7845c62fa24ac",
    "test_names_that_break_templates[none-rules1]": "0f9e024cdc91d1a4",
    "test_names_that_break_templates[none-rules2]": "c42fa5d4afb24467",
    "test_names_that_break_templates[none-rules3]": "f024268fff2fcfbf",
    "test_names_that_break_templates[none-rules4]": "ddaef7634c62600c",
    "test_names_that_break_templates[none-rules5]": "443bececa2861b96",
    "test_names_that_break_templates[none-rules6]": "1b6666ea66ef8565",
    "test_names_that_break_templates[none-rules7]": "0b5c46849bd01002",
    "test_names_that_break_templates[none-rules8]": "353dcab09f6145a1",
}


def _variants(config: Config, names: list[str]) -> list[Config]:
    """The config, and with run-time rules of every kind of glob: blind, with digits, ``?``, a
    class; skip, defer and the activation-scale switch."""
    one = next((n for n in names if "experts.1." in n), names[len(names) // 2])
    stem = one.rsplit(".", 1)[0]
    return [
        config,
        with_rules(config, skip=("*.experts.1.*",)),
        with_rules(config, skip=("*layers.1.*", "*.?.*norm*")),
        with_rules(config, defer=("*.experts.1?.*", "*.experts.[23].*")),
        with_rules(config, defer=(stem + ".*",)),
        with_rules(config, skip_activation_scales=True),
        with_rules(config, skip=("no.such.*",)),
        with_rules(config, skip=("*",)),
    ]


def _config_for(tmp_path: Path, model: dict, extra: dict[str, object] | None = None) -> Config:
    """The config ``--config auto`` picks for a preset's JSON files."""
    (tmp_path / "config.json").write_text(json.dumps(model))
    for file, doc in (extra or {}).items():
        (tmp_path / file).write_text(json.dumps(doc))
    return choose("auto", tmp_path)[0]


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_each_published_preset_under_each_config(
    preset: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pub = PUBLISHED[preset]()
    tensors = _rows([(t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    auto = _config_for(tmp_path, model, pub.extra)
    pinned = _Pinned(request)
    for config in _variants(auto, list(tensors)):
        pinned(tensors, config, model)
    assert pinned.said[0][:8] != "('error'"  # the preset's own config takes it
    for name in shipped_configs():
        pinned(tensors, load_config(name), model)
    pinned.check()


def test_the_synth_presets(request: pytest.FixtureRequest) -> None:
    pinned = _Pinned(request)
    for spec in (PRESETS["small"],):
        tensors = _rows([(t.name, t.dtype, t.shape) for t in planned_tensors(spec)])
        for variant in _variants(load_config(), list(tensors)):
            pinned(tensors, variant, None)
    pinned.check()


def test_full_size_deepseek_v3(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pub = PUBLISHED["deepseek-v3-full"]()
    tensors = _rows([(t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    config = _config_for(tmp_path, model)
    pinned = _Pinned(request)
    pinned(tensors, config, model)
    pinned(tensors, with_rules(config, skip=("model.layers.61.*",)), model)
    pinned.check()


@pytest.mark.parametrize("preset", ["deepseek-v3-tiny", "nvfp4-tiny", "qwen3-fp8-tiny"])
def test_names_under_another_prefix(
    preset: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A release stored under another prefix (a multimodal one's ``language_model.``): the config's
    rules match the names rewritten into its prefix, and a rule given at run time the stored
    names too."""
    pub = PUBLISHED[preset]()
    tensors = _rows([("language_model." + t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    auto = _config_for(tmp_path, model, pub.extra)
    stored = with_rules(auto, skip=("language_model.model.layers.1.*",))
    pinned = _Pinned(request)
    for config in [*_variants(auto, list(tensors)), stored]:
        pinned(tensors, config, model)
    assert pinned.said[0][:8] != "('error'" and pinned.said[-1][:8] != "('error'"
    pinned.check()


def test_a_way_with_no_scale_tensor_for_a_scaled_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A family's way that reads no scale tensor but resolves to a scaled codec: its weights are
    checked as rules given outright are (their scales named by the rule), a missing scale
    worded."""
    monkeypatch.setitem(
        FAMILIES, "fp8-block", (Pick("F8_E4M3", "fp8", ".weight_scale_inv", scaled=False),)
    )
    pub = PUBLISHED["deepseek-v3-tiny"]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    model = dict(pub.config)
    config = _config_for(tmp_path, model)
    got = _facts(_rows(planned), config, model)
    assert isinstance(got, tuple) and got[0] != "error"
    gone = next(n for n, _, _ in planned if n.endswith(".weight_scale_inv"))
    got = _facts(_rows([p for p in planned if p[0] != gone]), config, model)
    weight = gone.removesuffix("_scale_inv")
    assert got == (
        "error",
        f"tensor {weight}: rule 19 (match '*', role fp8, split replicate) needs its scale "
        f"{gone}, which the checkpoint lacks",
    ), got


@pytest.mark.parametrize("strict", [True, False])
def test_a_strict_config_s_kv_cache_refusals(strict: bool, tmp_path: Path) -> None:
    """A strict config refuses a layer with a k scale and no v scale; with another problem beside
    it both are worded, the refusals first; a config that reports loads it."""
    pub = PUBLISHED["deepseek-v3-tiny"]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    planned += [("model.layers.0.self_attn.k_scale", "F32", ())]
    model = dict(pub.config)
    auto = _config_for(tmp_path, model)
    config = auto if strict else replace(auto, kv_scales="report")
    got = _facts(_rows(planned), config, model)
    assert isinstance(got, tuple)
    if not strict:
        assert got[0] != "error"
        return
    assert got[0] == "error" and "one of k and v" in got[1] and "refused" in got[1], got
    other = [*planned, ("model.layers.0.mystery", "I8", (4,))]  # no way takes I8: unresolved
    got = _facts(_rows(other), config, model)
    assert isinstance(got, tuple) and got[0] == "error", got
    assert got[1].index("refused") < got[1].index("I8 tensors"), got


def _toml(tmp_path: Path, rules: str, extra: str = "") -> Config:
    path = tmp_path / "c.toml"
    path.write_text(f'description = "t"\ncodecs = ["fp8-block"]\n{extra}\n{rules}')
    return load_config(path)


def _rule(match: str, role: str = "auto", more: str = "") -> str:
    return f'[[rules]]\nmatch = "{match}"\nrole = "{role}"\n{more}\n'


TRICKY = [
    # leading zeros, the same value spelt twice, long runs, a run at the end
    ("model.layers.01.mlp.experts.007.w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.01.mlp.experts.007.w.weight_scale_inv", "F32", (1, 1)),
    ("model.layers.1.mlp.experts.7.w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.1.mlp.experts.7.w.weight_scale_inv", "F32", (1, 1)),
    ("model.layers.1.mlp.experts.0.w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.1.mlp.experts.0.w.weight_scale_inv", "F32", (1, 1)),
    ("model.layers.1.mlp.experts.00.w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.1.mlp.experts.00.w.scale", "F32", (1, 1)),
    ("model.layers.12.mlp.experts.123456789012.w.weight", "BF16", (4, 4)),
    ("model.layers.12.norm2", "BF16", (4,)),
    ("model.layers.2.norm2", "F32", (4,)),
    ("model.layers.3.self_attn.k_scale", "F32", ()),
    ("model.layers.3.self_attn.v_scale", "F32", ()),
    ("model.layers.3.self_attn.o_proj.weight", "BF16", (8, 8)),
    ("model.layers.3.self_attn.q_proj.weight", "BF16", (8, 8)),
    ("x.input_scale", "F32", ()),
    ("y.input_scale", "F32", (2,)),
]


RULES = [
    _rule("*"),
    _rule("*.experts.*", more="experts = true") + _rule("*"),
    _rule("*.layers.1.*", "skip") + _rule("*"),
    _rule("*.layers.?.*.weight", more="split = 'rows'") + _rule("*"),
    _rule("*.experts.0[07].*", "defer", "experts = true") + _rule("*"),
    _rule("*.norm[0-9]", "skip") + _rule("*"),
    _rule("*.experts.*.w.weight", "fp8", "experts = true\nsplit = 'rows'") + _rule("*"),
    _rule("model.layers.1.*") + _rule("*.weight_scale_inv", "skip") + _rule("*"),
    _rule("*.weight"),
]


@pytest.mark.parametrize("rules", RULES, ids=[f"rules{i}" for i in range(len(RULES))])
@pytest.mark.parametrize("templated", [True, False], ids=["templates", "none"])
def test_names_that_break_templates(
    rules: str, templated: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The tricky names, and with a name that is not ASCII beside them (pinned when such names had
    no templates and were classified name by name; the templates read them as UTF-8 now)."""
    tensors = _rows(
        TRICKY if templated else [*TRICKY, ("model.layers.1.\u00e9.weight", "BF16", (4,))]
    )
    assert tensors.table.templates.whole
    pinned = _Pinned(request, tmp_path)
    for extra in ("", "[layout]\nexpert_pattern = 'experts\\.(\\d)\\.'"):
        config = _toml(tmp_path, rules, extra)
        for variant in (config, with_rules(config, skip_activation_scales=True)):
            pinned(tensors, variant, {"num_attention_heads": 8})
    pinned.check()


def test_first_rules_is_rule_for_of_each_name(tmp_path: Path) -> None:
    names = [n for n, _, _ in TRICKY] + ["a1b", "a12b", "a.1", "a.12", "b"]
    config = _toml(
        tmp_path, _rule("a?b") + _rule("a.1") + _rule("*.1?.*") + _rule("*[13]*") + _rule("*.w.*")
    )
    tpl = _rows([(n, "F32", ()) for n in names]).table.templates
    assert tpl is not None
    at = first_rules(names, config.rules, tpl).tolist()
    want = [config.rule_for(n) for n in names]
    assert [config.rules[i] if i < len(config.rules) else None for i in at] == want


def test_first_rules_whatever_the_digits() -> None:
    # first_rules matches the globs that cannot tell digits apart once a template, the others per
    # name, and the first rule wins; names read whole (a digit other than 0-9, a surrogate) too
    rules = tuple(
        Rule(match=m, role="skip", index=i)
        for i, m in enumerate(
            [
                "layers.1?.mlp.*",
                "layers.*.attn.w[02]",
                "layers.*.mlp.experts.*",
                "layers.?.x",
                "*.7",
                "layers.*",
            ],
            1,
        )
    )
    names = [
        f"layers.{a}.{b}"
        for a in ("0", "1", "7", "10", "12", "21", "123", "٣")
        for b in ("mlp.experts.3", "mlp.gate", "attn.w0", "attn.w1", "attn.w2", "x", "7", "y.77")
    ]
    names += ["other", "other.7", "other.17", "\ud800.7", "layers.\ud800.x", ""]
    tpl = templates(names)
    assert not tpl.whole
    for config in (Config("t", rules), Config("b", rules[2:3] + rules[5:])):  # b: no sighted glob
        at = first_rules(names, config.rules, tpl).tolist()
        want = [config.rule_for(n) for n in names]
        assert [config.rules[i] if i < len(config.rules) else None for i in at] == want


def test_the_join_finds_each_renamed_name() -> None:
    """By template and parameters, whatever the suffix and replacement: digits in either, a
    replacement's run joining the stem's, new names read whole (a literal template), a literal
    template's own name."""
    names = [n for n, _, _ in TRICKY] + [
        "a.1.w",
        "a.1.s2",
        "a.12.s",
        "a.1.w\u0663",
        "b.\u0663.w",
        "b.\u0663.s",
        "c." + "9" * 19 + ".w",
        "c." + "9" * 19 + ".s",
        "d.1.2.3.4.5.6.7.8.9.10.11.12.13.14.15.16.w",
        "d.1.2.3.4.5.6.7.8.9.10.11.12.13.14.15.16.s.1",
        "e.\u00e9.1.w",
        "e.\u00e9.1.s\u00e9",
    ]
    table = _rows([(n, "F32", ()) for n in names]).table
    tpl = table.templates
    assert not tpl.whole
    join = Join(tpl, table.names)
    pairs = [(".weight", ".weight_scale_inv"), (".weight", ".scale"), ("2", "3"), ("w", "s2")]
    pairs += [("1.w", "12.s"), (".w", "2.s"), ("w", "\u0663"), ("w\u0663", "w"), ("w", "s")]
    pairs += [("w", "s.1"), ("w", "s\u00e9"), ("", ".s"), (".w", "")]
    for t in range(len(tpl.texts)):
        rows = join.rows(t)
        for suffix, new in pairs:
            want = [
                table.row.get(names[k][: len(names[k]) - len(suffix)] + new, -1)
                if names[k].endswith(suffix)
                else -1
                for k in rows.tolist()
            ]
            assert join.renamed(rows, t, suffix, new).tolist() == want, (tpl.texts[t], suffix)


@pytest.mark.parametrize("preset", ["nvfp4-tiny", "deepseek-v3-tiny"])
def test_activation_scales_by_template_are_those_named_so(preset: str) -> None:
    from tpload.planning.planner import _activation_scales

    pub = PUBLISHED[preset]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    planned += [("a.1.input_scale", "F32", (1, 1)), ("a.2.input_scale", "F32", (2,))]
    tensors = _rows(planned)
    want = [n for n, _, s in planned if n.endswith(".input_scale") and int(np.prod(s)) == 1]
    assert _activation_scales(tensors, tensors.table) == want
    assert preset != "nvfp4-tiny" or len(want) > 1


def test_experts_read_off_the_templates_are_those_the_pattern_finds() -> None:
    import re

    planned = [(t.name, t.dtype, t.shape) for t in PUBLISHED["deepseek-v4-tiny"]().planned()]
    planned += [(n, d, s) for n, d, s in TRICKY]
    planned += [
        ("a.experts." + "0" * 19 + "1.w", "F32", ()),
        ("b.experts.1.experts.2.w", "F32", ()),
        ("c.experts.\u0663.w", "F32", ()),
        ("d.experts.7.\u0663.w", "F32", ()),
        ("e.experts." + "9" * 19 + ".w", "F32", ()),
    ]
    table = _rows(planned).table
    assert not table.templates.whole
    rx = re.compile(classify.DEFAULT_EXPERTS)
    rows = np.arange(len(table), dtype=np.int64)
    cut, numbers, lost = classify._by_template(table, rows, rx)
    want = [classify._expert_in(rx, n) for n in table.names]
    assert lost.tolist() == [x is None for x in want] and 0 < lost.sum() < len(want)
    got = list(zip(cut, numbers, strict=True))
    assert [g for g, w in zip(got, want, strict=True) if w] == [w for w in want if w]


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_the_census_of_the_attention_names_is_the_census_of_them_all(preset: str) -> None:
    """classify hands the KV-cache census only the names that hold "attn": every name its patterns
    read holds it, so the census is the same."""
    from tpload.selection.kvscales import census

    names = [t.name for t in PUBLISHED[preset]().planned()]
    names += [n for n, _, _ in TRICKY] + ["blk.3.attn_k_scale", "blk.3.attn_v_scale.weight"]
    names += ["model.layers.7.self_attn.kv_scale", "x.layers.2.self_attn.qkv_proj.k_scale"]
    whole, attn = census(names), census([n for n in names if "attn" in n])
    assert whole.to_dict() == attn.to_dict() and whole.problems() == attn.problems()
    assert whole.engine_names() == attn.engine_names() and whole.describe() == attn.describe()


def test_every_kind_of_problem_at_once(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Each problem a classification words, together, in their order: a weight of a rule given
    outright lacking its scale, the KV-cache refusals, a skip rule taking served weights' scales,
    a tensor no way resolves, an expert with no index, a class that does not fit, tensors no rule
    matches, an idle run-time rule."""
    pub = PUBLISHED["deepseek-v3-tiny"]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    planned += [
        ("lonely.weight", "F8_E4M3", (128, 128)),
        ("model.layers.0.mystery.weight", "I8", (4,)),
        ("model.layers.0.self_attn.k_scale", "F32", ()),
        ("x.experts.q.w.weight", "BF16", (4, 4)),
        ("bad.weight", "F8_E4M3", (128, 128)),
        ("bad.weight_scale_inv", "F32", (7, 7)),
        ("model.layers.0.extra_bias", "BF16", (4,)),
    ]
    tensors = _rows(planned)
    rules = (
        _rule("lonely.weight", "fp8")
        + _rule("model.layers.1.*.weight_scale_inv", "skip")
        + _rule("*.experts.*", more="experts = true")
        + _rule("*.weight")
    )
    config = _toml(tmp_path, rules)
    pinned = _Pinned(request, tmp_path)
    for variant in (config, with_rules(config, skip=("no.such.*",))):
        for kv in ("strict", "report"):
            got = pinned(tensors, replace(variant, kv_scales=kv), dict(pub.config))
            assert isinstance(got, tuple) and got[0] == "error", got
    pinned.check()


def test_class_keys_too_wide_for_one_number_are_keyed_column_by_column() -> None:
    """The class keys' columns make one mixed-radix number a row; where their widths' product would
    not fit one, the columns side by side give the same distinct keys, first rows and numbering."""
    rng = np.random.default_rng(0)
    cols = [rng.integers(0, 3, 500) for _ in range(5)]
    narrow = keyed([(c, 3) for c in cols], 500)
    wide = keyed([(c, 1 << 20) for c in cols], 500)
    assert [x.tolist() for x in narrow] == [x.tolist() for x in wide]
    seen: dict[tuple[int, ...], int] = {}
    for j, key in enumerate(zip(*(c.tolist() for c in cols), strict=True)):
        seen.setdefault(key, j)
    assert sorted(seen.values()) == sorted(narrow[0].tolist())

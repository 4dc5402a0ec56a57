"""Classification once per name template (classify's columns path) gives what the name-by-name walk
gives: the same entries, classes, scales, experts, skipped and deferred tensors, census, or the
same error, for every published and synth preset's names under every shipped config, with skip,
defer and activation-scale rules of each kind of glob, and on names made to break templates
(leading zeros, digits in suffixes and globs, ``?``, ``[class]``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tpload.planning.classify as classify
from tpload.loading.pick import choose
from tpload.model.errors import ConfigError
from tpload.planning.templated import Join, first_rules
from tpload.selection.config import (
    FAMILIES,
    Config,
    Pick,
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
            problems=[],
            model=model,
            root="x",
            order=tensors.table.natural_names(),
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


def _both(
    tensors: TableRows, config: Config, model: dict | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[object, bool]:
    """The columns path's answer (asserted equal to the walk's) and whether it took the names."""
    took = []
    columns = classify._by_columns

    def counted(*args: object, **kwargs: object) -> object:
        got = columns(*args, **kwargs)  # type: ignore[arg-type]
        took.append(got is not None)
        return got

    with monkeypatch.context() as m:
        m.setattr(classify, "_by_columns", counted)
        fast = _facts(tensors, config, model)
    with monkeypatch.context() as m:
        m.setattr(classify, "_by_columns", lambda *a, **k: None)
        walked = _facts(tensors, config, model)
    assert fast == walked
    return fast, any(took)


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
def test_every_published_preset_under_every_shipped_config(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = PUBLISHED[preset]()
    tensors = _rows([(t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    auto = _config_for(tmp_path, model, pub.extra)
    took = []
    for config in _variants(auto, list(tensors)):
        took.append(_both(tensors, config, model, monkeypatch)[1])
    assert took[0]  # the preset's own config: the columns path took every name
    for name in shipped_configs():
        _both(tensors, load_config(name), model, monkeypatch)


def test_the_synth_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    for spec in (PRESETS["small"],):
        tensors = _rows([(t.name, t.dtype, t.shape) for t in planned_tensors(spec)])
        config = load_config()
        for variant in _variants(config, list(tensors)):
            _both(tensors, variant, None, monkeypatch)
        assert _both(tensors, config, None, monkeypatch)[1]


def test_full_size_deepseek_v3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pub = PUBLISHED["deepseek-v3-full"]()
    tensors = _rows([(t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    config = _config_for(tmp_path, model)
    assert _both(tensors, config, model, monkeypatch)[1]
    _both(tensors, with_rules(config, skip=("model.layers.61.*",)), model, monkeypatch)


@pytest.mark.parametrize("preset", ["deepseek-v3-tiny", "nvfp4-tiny", "qwen3-fp8-tiny"])
def test_names_under_another_prefix(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release stored under another prefix (a multimodal one's ``language_model.``): the columns
    path matches the names rewritten into the config's prefix, and a rule given at run time the
    stored names too."""
    pub = PUBLISHED[preset]()
    tensors = _rows([("language_model." + t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    auto = _config_for(tmp_path, model, pub.extra)
    stored = with_rules(auto, skip=("language_model.model.layers.1.*",))
    took = [
        _both(tensors, config, model, monkeypatch)[1]
        for config in [*_variants(auto, list(tensors)), stored]
    ]
    assert took[0] and took[-1], took


def test_a_way_with_no_scale_tensor_for_a_scaled_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A family's way that reads no scale tensor but resolves to a scaled codec: its weights are
    checked as rules given outright are (their scales named by the rule), by the columns path
    too; a missing scale is the walk's to word."""
    monkeypatch.setitem(
        FAMILIES, "fp8-block", (Pick("F8_E4M3", "fp8", ".weight_scale_inv", scaled=False),)
    )
    pub = PUBLISHED["deepseek-v3-tiny"]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    model = dict(pub.config)
    config = _config_for(tmp_path, model)
    fast, took = _both(_rows(planned), config, model, monkeypatch)
    assert took and fast[0] != "error"
    gone = next(n for n, _, _ in planned if n.endswith(".weight_scale_inv"))
    fast, took = _both(_rows([p for p in planned if p[0] != gone]), config, model, monkeypatch)
    assert not took and fast[0] == "error" and "needs its scale" in fast[1], fast


@pytest.mark.parametrize("strict", [True, False])
def test_a_strict_config_s_kv_cache_refusals(
    strict: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A strict config refuses a layer with a k scale and no v scale: the columns path raises the
    refusal as the walk words it, without walking (with another problem beside it, the walk words
    both); a config that reports loads it."""
    pub = PUBLISHED["deepseek-v3-tiny"]()
    planned = [(t.name, t.dtype, t.shape) for t in pub.planned()]
    planned += [("model.layers.0.self_attn.k_scale", "F32", ())]
    model = dict(pub.config)
    auto = _config_for(tmp_path, model)
    config = auto if strict else replace(auto, kv_scales="report")
    walks = []
    walk = classify._walk

    def walked(*args: object, **kwargs: object) -> object:
        walks.append(1)
        return walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(classify, "_walk", walked)
    fast, _ = _both(_rows(planned), config, model, monkeypatch)
    assert walks == [1]  # _both's own walk only
    if not strict:
        assert fast[0] != "error"
        return
    assert fast[0] == "error" and "one of k and v" in fast[1] and "refused" in fast[1], fast
    other = [*planned, ("model.layers.0.mystery", "I8", (4,))]  # no way takes I8: unresolved
    fast, _ = _both(_rows(other), config, model, monkeypatch)
    assert fast[0] == "error" and "refused" in fast[1] and "I8" in fast[1], fast


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


@pytest.mark.parametrize(
    "rules",
    [
        _rule("*"),
        _rule("*.experts.*", more="experts = true") + _rule("*"),
        _rule("*.layers.1.*", "skip") + _rule("*"),
        _rule("*.layers.?.*.weight", more="split = 'rows'") + _rule("*"),
        _rule("*.experts.0[07].*", "defer", "experts = true") + _rule("*"),
        _rule("*.norm[0-9]", "skip") + _rule("*"),
        _rule("*.experts.*.w.weight", "fp8", "experts = true\nsplit = 'rows'") + _rule("*"),
        _rule("model.layers.1.*") + _rule("*.weight_scale_inv", "skip") + _rule("*"),
        _rule("*.weight"),
    ],
)
def test_names_that_break_templates(
    rules: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = _rows(TRICKY)
    took = []
    for extra in ("", "[layout]\nexpert_pattern = 'experts\\.(\\d)\\.'"):
        config = _toml(tmp_path, rules, extra)
        for variant in (config, with_rules(config, skip_activation_scales=True)):
            took.append(_both(tensors, variant, {"num_attention_heads": 8}, monkeypatch)[1])
    TOOK.append(any(took))


TOOK: list[bool] = []


def test_the_columns_path_took_most_of_the_tricky_names() -> None:
    """Not every case above falls back to the walk (which would make them prove nothing)."""
    assert sum(TOOK) >= len(TOOK) // 2, TOOK


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


def test_the_join_finds_each_renamed_name_or_none() -> None:
    names = [n for n, _, _ in TRICKY]
    table = _rows([(n, "F32", ()) for n in names]).table
    tpl = table.templates
    assert tpl is not None
    join = Join(tpl)
    for t in range(len(tpl.texts)):
        rows = join.rows(t)
        for suffix, new in ((".weight", ".weight_scale_inv"), (".weight", ".scale"), ("2", "3")):
            got = join.renamed(rows, t, suffix, new)
            if got is None:
                continue
            want = [
                table.row.get(names[k][: -len(suffix)] + new, -1)
                if names[k].endswith(suffix)
                else -1
                for k in rows.tolist()
            ]
            assert got.tolist() == want


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
    ]
    table = _rows(planned).table
    rx = re.compile(classify.DEFAULT_EXPERTS)
    rule = load_config().rules[0]
    took = 0
    indexed = [n for n in table.names if rx.search(n) and "0" * 19 not in n]
    for names in (indexed, table.names):
        rows = np.asarray([table.row[n] for n in names], np.int64)
        got = classify._experts_by_template(table, rows, rx)
        want = [
            classify._expert_of(rx, n, rule.__class__(match="*", role="plain", experts=True))
            for n in names
        ]
        if got is None:
            assert None in want  # only where a name has no index (or one too long)
            continue
        assert list(zip(*got, strict=True)) == want
        took += 1
    assert took == 1  # the names that all have an index: read off the templates


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

"""The tensor table's natural order is natural_sorted's, name for name (digests list their tensors
in it): on every preset's names and on names built to break a template split."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tpload.model.table import TensorTable, natural_order, natural_subset, templates
from tpload.model.templates import natural_sorted


def _ordered(names: list[str]) -> list[str]:
    return [names[i] for i in natural_order(names).tolist()]


def _shuffled(names: list[str], seed: int = 0) -> list[str]:
    out = list(names)
    random.Random(seed).shuffle(out)
    return out


FULL = ("deepseek-v3-full", "deepseek-v4-full", "qwen3-fp8-full", "nvfp4-full", "gpt-oss-full")


def _published() -> list[str]:
    from tpload.tools.published import PUBLISHED

    return list(PUBLISHED)


@pytest.mark.parametrize(
    "preset",
    [pytest.param(p, marks=pytest.mark.slow) if p in FULL else p for p in _published()],
)
def test_every_published_preset_sorts_as_natural_sorted(preset: str) -> None:
    from tpload.tools.published import PUBLISHED

    names = [p.name for p in PUBLISHED[preset]().planned()]
    tpl = templates(names)
    assert tpl is not None  # a real checkpoint's names: the fast path, not the fallback
    for order in (names, _shuffled(names)):
        assert _ordered(order) == natural_sorted(order)


def test_the_synth_and_gguf_presets_sort_as_natural_sorted() -> None:
    from tpload.tools.synth import PRESETS, planned_tensors
    from tpload.tools.synth_gguf import GGUF_PRESETS

    for spec in PRESETS.values():
        names = _shuffled([p.name for p in planned_tensors(spec)])
        assert _ordered(names) == natural_sorted(names)
    for listed in GGUF_PRESETS.values():
        names = _shuffled([name for name, _, _ in listed()[2]])
        assert _ordered(names) == natural_sorted(names)


ADVERSARIAL = [
    # leading zeros: "02" before "2", "002" before "02"; but "0" before "00" before "000"
    ["x.2", "x.02", "x.002", "x.1", "x.10", "x.0", "x.00", "x.000", "x.01", "x.010"],
    # templates that interleave: the run decides before the text after it
    ["a1.x", "a2.b", "a1.b", "a10.a", "a", "a.", "a0", "", "0", "00", "1", "b", "A1", "_1"],
    # a name that is a prefix of another, runs at either end
    ["layer", "layer1", "layer1x", "layer1.", "1layer", "01layer", "layer1.2.3", "layer1.2"],
    # digit runs at the int64 edge and past it (the fallback)
    ["w.9223372036854775807", "w.9223372036854775808", "w.18446744073709551616", "w.5"],
    ["w.999999999999999999", "w.1000000000000000000", "w.0999999999999999999"],
    ["w." + "0" * 70 + "1", "w.1", "w." + "0" * 63 + "1", "w.2"],
    # not ASCII: other scripts' digits are \d too (Arabic-Indic three, fullwidth one)
    ["x.\u0663", "x.3", "x.\uff11", "x.2", "é.1", "e.1"],
    # a newline inside a name (the joint of the byte pass)
    ["a\n1", "a\n01", "a1", "a"],
    # more runs than the columns hold
    [".".join(str(random.Random(k).randrange(3)) for _ in range(20)) for k in range(30)],
    # punctuation around runs, '#' (the prototype's mark) and bytes near the digits
    ["x#1", "x#01", "x/1", "x:1", "x1#", "x#", "x.#.1", "x.9.1", "x./.1"],
]


@pytest.mark.parametrize("names", ADVERSARIAL)
def test_names_built_to_break_the_split_sort_as_natural_sorted(names: list[str]) -> None:
    for order in (names, _shuffled(names, 1), _shuffled(names, 2)):
        assert _ordered(order) == natural_sorted(order)


def test_random_names_over_digits_and_dots_sort_as_natural_sorted() -> None:
    rng = random.Random(29)
    for _ in range(50):
        names = list(
            {
                "".join(rng.choice("ab.0012_9") for _ in range(rng.randrange(0, 12)))
                for _ in range(300)
            }
        )
        assert _ordered(names) == natural_sorted(names)


def test_names_the_split_cannot_read_are_literal_templates() -> None:
    odd = ["x.\u0663", "a\nb", "w.1" + "0" * 18, ".".join("1" * 17), "s.\ud800.1"]
    # a digit other than 0-9, the joint, 19 significant digits, 17 runs, a lone surrogate
    for name in odd:
        names = ["a.1", name, "a.2"]
        tpl = templates(names)
        assert tpl.literal.tolist() == [False, True] and not tpl.whole
        assert [tpl.texts[t] for t in tpl.ids.tolist()] == [("a.", ""), (name,), ("a.", "")]
        assert tpl.values.tolist() == [[1], [-1], [2]]
        assert [names[i] for i in natural_order(names)] == natural_sorted(names)
    many = [f"b.{k}.{odd[k % len(odd)] if k % 7 == 0 else 'w'}" for k in range(60)]
    assert [many[i] for i in natural_order(many)] == natural_sorted(many)
    assert templates(["w.1" + "0" * 17]).whole
    assert templates(["\u00e9.1.w", "\u00e9.2.w"]).texts == [("\u00e9.", ".w")]  # UTF-8, read
    assert templates([]).whole and len(natural_order([])) == 0


def test_templates_and_parameters() -> None:
    names = ["m.layers.3.experts.17.w1", "m.layers.10.experts.2.w3", "m.norm", "m.layers.07.x"]
    tpl = templates(names)
    assert [tpl.texts[t] for t in tpl.ids.tolist()] == [
        ("m.layers.", ".experts.", ".w", ""),
        ("m.layers.", ".experts.", ".w", ""),
        ("m.norm",),
        ("m.layers.", ".x"),
    ]
    assert tpl.values.tolist() == [[3, 17, 1], [10, 2, 3], [-1, -1, -1], [7, -1, -1]]
    assert tpl.zeros[3].tolist() == [1, 0, 0]
    assert tpl.run_counts().tolist() == [3, 0, 1]


def test_a_table_holds_columns_and_its_natural_order() -> None:
    names = ["b.10", "b.2", "a"]
    table = TensorTable(
        names,
        files=["one.safetensors"],
        file_id=np.zeros(3, np.int32),
        dtypes=["BF16", "F32"],
        dtype_code=np.array([0, 1, 0], np.int16),
        shape=np.array([[4, 6] + [0] * 6, [3] + [0] * 7, [0] * 8], np.int64),
        ndim=np.array([2, 1, 0], np.int8),
        begin=np.array([0, 48, 60], np.int64),
        nbytes=np.array([48, 12, 2], np.int64),
    )
    assert table.natural_names() == ["a", "b.2", "b.10"]
    assert table.place.tolist() == [2, 1, 0]
    assert table.rows.tolist() == [4, 1, 1] and table.row_bytes.tolist() == [12, 12, 2]
    assert table.shape_of(0) == (4, 6) and table.shape_of(2) == ()
    assert table.dtype_of(1) == "F32" and table.file_of(2) == "one.safetensors"
    place = dict(zip(table.natural_names(), range(3), strict=True))
    assert natural_subset(["b.10", "a"], place) == ["a", "b.10"]
    assert natural_subset(["b.10", "zz"], place) == natural_sorted(["b.10", "zz"])

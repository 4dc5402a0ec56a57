"""Names the templates read whole (a literal template each: a digit other than 0-9, a run of 19
digits, 17 runs, a newline), beside the tricky names, and weights whose scales fall on the other
side of that split (a scale or a suffix holding a digit other than 0-9). Each test's outcomes are
pinned to their digest: printed (``TPLOAD_PIN=1 python -m pytest -s``) with main's tpload at
d7ed6cf, where such names had no templates and every name was classified name by name."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tpload.selection.config import with_rules
from tpload.storage.safetensors import TableRows

from .test_classify_names import RULES, TRICKY, _facts, _rows, _rule, _said, _toml

WHOLE = [
    ("model.layers.1.\u0663.w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.1.\u0663.w.weight_scale_inv", "F32", (1, 1)),
    ("model.layers.1.mlp.experts." + "9" * 19 + ".w.weight", "F8_E4M3", (128, 128)),
    ("model.layers.1.mlp.experts." + "9" * 19 + ".w.weight_scale_inv", "F32", (1, 1)),
    ("model.layers.2.mlp.experts.3." + ".".join(map(str, range(15))) + ".w.weight", "BF16", (4,)),
    ("model.layers.2.a\nb.weight", "BF16", (4,)),
]

SPLIT = [  # read by the templates, their scales not (and the other way round)
    ("model.layers.3.q.weight", "F8_E4M3", (128, 128)),
    ("model.layers.3.q.s\u0663", "F32", (1, 1)),
    ("model.layers.4.k.w\u0663", "F8_E4M3", (128, 128)),
    ("model.layers.4.k.s", "F32", (1, 1)),
]

SPLIT_RULES = _rule("*.q.weight", "fp8", "scale = '.s\u0663'\nsplit = 'rows'") + _rule(
    "*.k.w\u0663", "fp8", "suffix = '.w\u0663'\nscale = '.s'"
)

PINNED: dict[str, str] = {
    "test_names_read_whole[rules0]": "c62cf1cf4b7bfb37",
    "test_names_read_whole[rules1]": "308fb7c546235ac2",
    "test_names_read_whole[rules2]": "f9b6dd2de0adc906",
    "test_names_read_whole[rules3]": "a6cdb028c5d08d21",
    "test_names_read_whole[rules4]": "ee4a34e571d5c57e",
    "test_names_read_whole[rules5]": "a0a49b9ee6352f86",
    "test_names_read_whole[rules6]": "bf3bc88089e84b10",
    "test_names_read_whole[rules7]": "0b5c46849bd01002",
    "test_names_read_whole[rules8]": "353dcab09f6145a1",
    "test_a_weight_and_its_scale_on_either_side[rules0]": "13d6f98ab83f6c85",
    "test_a_weight_and_its_scale_on_either_side[rules6]": "7e3802ffed1d4c49",
}


@pytest.mark.parametrize("rules", RULES, ids=[f"rules{i}" for i in range(len(RULES))])
def test_names_read_whole(rules: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    tensors = _rows([*TRICKY, *WHOLE])
    assert tensors.table.templates.literal.sum() == 6  # (main: no templates)
    _check(tensors, rules, tmp_path, request)


@pytest.mark.parametrize("rules", [RULES[0], RULES[6]], ids=["rules0", "rules6"])
def test_a_weight_and_its_scale_on_either_side(
    rules: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A scale the templates read whole beside a weight they read, and the other way round: the
    join finds each (under rules6 the weights of its fp8 rule lack their .scale: refused)."""
    tensors = _rows([*TRICKY, *WHOLE, *SPLIT])
    assert tensors.table.templates.literal.sum() == 8  # (main: no templates)
    said = _check(tensors, SPLIT_RULES + rules, tmp_path, request)
    assert said[0].startswith("('error'") == (rules == RULES[6])


def _check(tensors: TableRows, rules: str, tmp: Path, request: pytest.FixtureRequest) -> list[str]:
    said = []
    for extra in ("", "[layout]\nexpert_pattern = 'experts\\.(\\d)\\.'"):
        config = _toml(tmp, rules, extra)
        for variant in (config, with_rules(config, skip_activation_scales=True)):
            said.append(_said(_facts(tensors, variant, {"num_attention_heads": 8}), tmp))
    got = hashlib.sha256("\n".join(said).encode()).hexdigest()[:16]
    if os.environ.get("TPLOAD_PIN"):
        print(f"PIN {request.node.name!r}: {got!r},")
    else:
        assert got == PINNED[request.node.name]
    return said

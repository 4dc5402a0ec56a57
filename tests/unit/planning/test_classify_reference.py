"""Classification held to a reference, whichever path takes the names: each tiny published preset's
names under its own config, and with skip, defer and activation-scale rules given at run time, as
one digest of everything a classification gives (entries, classes, scales, experts, skipped and
deferred tensors, head counts, the KV-cache census) or of its error's words. The digests were
taken on main before issue 37 merged classify's paths (the same on its branch); a change to any
tensor's outcome or any message changes one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tpload.selection.config import Config, with_rules
from tpload.storage.safetensors import TableRows
from tpload.tools.published import PUBLISHED

from .test_classify_names import _config_for, _facts, _rows

REFERENCE = {
    "deepseek-v3-tiny": "8b384f73165a02ad",
    "deepseek-v3-bf16-tiny": "545347c5ce3027e5",
    "deepseek-v4-tiny": "e40da84d0e35b02c",
    "gpt-oss-tiny": "764a4ea9465ca57c",
    "qwen3-fp8-tiny": "a37530392da0dad8",
    "nvfp4-tiny": "e916d7ebdbdeed7b",
    "llama-tiny": "5f288064a02272f8",
}


def _said(tensors: TableRows, config: Config, model: dict) -> object:
    """What a classification gives (test_classify_names.py's facts), as text that does not
    depend on the process (codecs by their class's name), or its error's words."""
    got = _facts(tensors, config, model)
    assert isinstance(got, tuple)
    if got[0] == "error":
        return got
    facts = list(got)
    facts[7] = [(r, type(codec).__name__, f, s) for r, codec, f, s in facts[7]]
    return tuple(facts)


def digest(preset: str, where: Path) -> str:
    pub = PUBLISHED[preset]()
    tensors = _rows([(t.name, t.dtype, t.shape) for t in pub.planned()])
    model = dict(pub.config)
    config = _config_for(where, model, pub.extra)
    variants = [
        config,
        with_rules(config, skip=("*.experts.1.*", "*layers.1.*")),
        with_rules(config, defer=("*.experts.[23].*",)),
        with_rules(config, skip_activation_scales=True),
        with_rules(config, skip=("no.such.*",)),
        with_rules(config, skip=("*",)),
    ]
    said = [repr(_said(tensors, v, model)) for v in variants]
    return hashlib.sha256("\n".join(said).encode()).hexdigest()[:16]


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_each_tiny_preset_classifies_as_the_reference(preset: str, tmp_path: Path) -> None:
    assert digest(preset, tmp_path) == REFERENCE[preset]

"""Each tiny published preset and the small synth preset, read from the files as a load reads them
(the catalogue's table, many shards), classifies as it did before classify's two paths became
one: the same entries, classes, scales, experts, skipped and deferred tensors, as one digest
(``PINNED``, taken on ``773b668``, where the columns path took each whole and the name-by-name walk
gave the same)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.planning.planner import Planner
from tpload.storage.catalogue import read_native

from .facts import classified_facts
from .test_classify_names import _said

TINY = [
    "deepseek-v3-tiny",
    "deepseek-v3-bf16-tiny",
    "deepseek-v4-tiny",
    "gpt-oss-tiny",
    "qwen3-fp8-tiny",
    "nvfp4-tiny",
    "llama-tiny",
]

PINNED: dict[str, str] = {
    "deepseek-v3-tiny": "425af2452c918d59",
    "deepseek-v3-bf16-tiny": "e737ed2967f8ff39",
    "deepseek-v4-tiny": "5c5d2cb46c7a3d5d",
    "gpt-oss-tiny": "b018f88be7d9c54f",
    "qwen3-fp8-tiny": "770ac2033e9d8b8a",
    "nvfp4-tiny": "c60d7f874aa9e6d7",
    "llama-tiny": "dacd4101023fc72a",
    "small": "ba494ec1c1f8ee81",
}


def _planner(root: Path) -> Planner:
    catalogue = read_native(root)[0]
    config, _ = choose("auto", root, pins=catalogue.pins)
    return planner_of(catalogue, config)


def _check(key: str, root: Path) -> None:
    said = _said(classified_facts(_planner(root).classified), root)
    got = hashlib.sha256(said.encode()).hexdigest()[:16]
    if os.environ.get("TPLOAD_PIN"):
        print(f"PIN {key!r}: {got!r},")
        return
    assert got == PINNED[key], (key, got)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tpload.tools.published import write_published

    base = tmp_path_factory.mktemp("presets")
    return {name: write_published(base / name, name) for name in TINY}


@pytest.mark.parametrize("preset", TINY)
def test_every_tiny_preset(preset: str, written: dict[str, Path]) -> None:
    _check(preset, written[preset])


def test_the_small_preset(small_ckpt: Path) -> None:
    _check("small", small_ckpt)

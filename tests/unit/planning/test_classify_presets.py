"""The columns path classifies every tiny published preset and the small synth preset, read from
the files as a load reads them, whole (the name-by-name walk never runs), and gives what the walk
gives: the same entries, classes, scales, experts, skipped and deferred tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

import tpload.planning.classify as classify
from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.planning.planner import Planner
from tpload.storage.catalogue import read_native

from .facts import classified_facts

TINY = [
    "deepseek-v3-tiny",
    "deepseek-v3-bf16-tiny",
    "deepseek-v4-tiny",
    "gpt-oss-tiny",
    "qwen3-fp8-tiny",
    "nvfp4-tiny",
    "llama-tiny",
]


def _planner(root: Path) -> Planner:
    catalogue = read_native(root)[0]
    config, _ = choose("auto", root, pins=catalogue.pins)
    return planner_of(catalogue, config)


def _facts(p: Planner) -> tuple:
    return classified_facts(p.classified)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tpload.tools.published import write_published

    base = tmp_path_factory.mktemp("presets")
    return {name: write_published(base / name, name) for name in TINY}


def _columns_then_walk(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    columns, walk = classify._by_columns, classify._walk

    def counted(*args: object, **kwargs: object) -> object:
        got = columns(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(got is not None)
        return got

    def walked(*args: object, **kwargs: object) -> object:
        calls.append("walk")
        return walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(classify, "_by_columns", counted)
    monkeypatch.setattr(classify, "_walk", walked)
    fast = _facts(_planner(root))
    assert calls == [True]  # the columns path classified every name: no walk
    monkeypatch.setattr(classify, "_by_columns", lambda *a, **k: None)  # the walk, name by name
    assert _facts(_planner(root)) == fast


@pytest.mark.parametrize("preset", TINY)
def test_the_columns_path_takes_every_tiny_preset(
    preset: str, written: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _columns_then_walk(written[preset], monkeypatch)


def test_the_columns_path_takes_the_small_preset(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _columns_then_walk(small_ckpt, monkeypatch)

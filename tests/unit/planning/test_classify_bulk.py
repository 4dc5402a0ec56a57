"""Classification in bulk (each distinct class key fitted once, the served names' classes a lookup)
gives what the name-by-name walk gives, on every tiny published preset and the synth presets:
the same entries, classes, scales, experts, skipped and deferred tensors."""

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

    base = tmp_path_factory.mktemp("bulk")
    return {name: write_published(base / name, name) for name in TINY}


@pytest.mark.parametrize("preset", TINY)
def test_the_bulk_path_classifies_as_the_walk_does(
    preset: str, written: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = written[preset]
    calls = []
    columns = classify._by_columns

    def counted(*args: object, **kwargs: object) -> object:
        got = columns(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(got is not None)
        return got

    monkeypatch.setattr(classify, "_by_columns", counted)
    fast = _facts(_planner(root))
    assert calls == [True]  # the columns path classified every name
    monkeypatch.setattr(classify, "_by_columns", lambda *a, **k: None)  # the walk, in bulk
    walk_calls = []
    bulk = classify._served

    def served(*args: object, **kwargs: object) -> object:
        got = bulk(*args, **kwargs)  # type: ignore[arg-type]
        walk_calls.append(got is not None)
        return got

    monkeypatch.setattr(classify, "_served", served)
    assert _facts(_planner(root)) == fast
    assert walk_calls == [True]  # the walk's bulk path served every name
    monkeypatch.setattr(classify, "_served", lambda *a, **k: None)  # the walk, name by name
    assert _facts(_planner(root)) == fast


def test_the_bulk_path_on_the_small_preset(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _facts(_planner(small_ckpt))
    monkeypatch.setattr(classify, "_by_columns", lambda *a, **k: None)
    assert _facts(_planner(small_ckpt)) == fast
    monkeypatch.setattr(classify, "_served", lambda *a, **k: None)
    assert _facts(_planner(small_ckpt)) == fast

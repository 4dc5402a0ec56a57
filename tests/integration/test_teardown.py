"""Teardown: two loads and releases in one torchrun process give host memory (and, on CUDA,
device memory) back to the baseline each time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tpload.tools.synth import SynthSpec, write_checkpoint

from ..helpers import HERE, torchrun

WORKER = str(HERE / "workers" / "teardown.py")
MIB = 1 << 20


@pytest.fixture(scope="module")
def big_arena(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # expanded at tp 1: 16 experts x 3 x 512 x 1024 bf16 + an 8192-row head, about 56 MiB per rank
    return write_checkpoint(
        tmp_path_factory.mktemp("t"), SynthSpec(hidden=512, inter=1024, experts=16, vocab=8192)
    )


@pytest.mark.parametrize("nproc", [2])
def test_load_release_twice_returns_to_baseline(
    big_arena: Path, tmp_path: Path, nproc: int
) -> None:
    out = tmp_path / "steps"
    run = torchrun(nproc, [WORKER, str(big_arena), str(out), "expanded"], timeout=240)
    assert run.rc == 0, run.text
    for r in range(nproc):
        s = json.loads(Path(f"{out}.{r}").read_text())
        base, arena = s["baseline"][0], s["arena"]
        assert arena > 20 * MIB
        slack = 16 * MIB  # first-use imports and thread stacks, not buffers
        for i in (1, 2):
            assert s[f"load{i}"][0] - base >= 0.9 * arena, s  # the arena really was host memory
            assert s[f"release{i}"][0] - base <= slack, s  # and all of it came back
        assert s["release2"][0] <= s["release1"][0] + 4 * MIB, s  # no growth from load to load
        assert s["usable_after_release"] is False
        if torch.cuda.is_available():
            assert s["release1"][1:] == s["release2"][1:] == s["baseline"][1:], s

"""Each published family's miniature, loaded by real torchrun ranks with its config picked from
config.json, served exactly: every rank's packed bytes and expanded bf16 bits against the
independent reference of tests/formats_reference.py. The quick tier runs tp 2 for every family in
one launch (which also loads five checkpoints, twice each, in one process); the slow tier adds
tp 1, tp 4 and tp 2 x ep 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.tools.published import write_published

from ..formats_reference import Family
from ..helpers import HERE, torchrun, tpload_cli

FAMILIES = {
    "deepseek-v3": "deepseek-v3-tiny",
    "deepseek-v4": "deepseek-v4-tiny",
    "gpt-oss": "gpt-oss-tiny",
    "nvfp4": "nvfp4-tiny",
    "qwen3-fp8": "qwen3-fp8-tiny",
    "llama": "llama-tiny",
}
WORKER = str(HERE / "workers" / "families.py")


@pytest.fixture(scope="module")
def miniatures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: write_published(root / family, preset) for family, preset in FAMILIES.items()}


def load_all(miniatures: dict[str, Path], out: Path, tp: int, ep: int) -> None:
    out.mkdir(exist_ok=True)
    run = torchrun(
        tp * ep,
        [WORKER, str(out), str(tp), str(ep), *(f"{f}={p}" for f, p in miniatures.items())],
        timeout=600,
    )
    assert run.rc == 0, run.text[-4000:]


def check(miniatures: dict[str, Path], out: Path, tp: int, ep: int) -> None:
    """Every rank of every family, both kinds: the same names, and each one's bytes exactly."""
    problems = []
    for family, root in miniatures.items():
        ref = Family(family, root)
        for kind in ("packed", "expanded"):
            for rank in range(tp * ep):
                got = torch.load(out / f"{family}-{kind}-rank{rank}.pt")
                want = ref.expected(tp, ep, rank, kind)
                names = set(got) - {"__shapes__", "__config__"}
                if names != set(want):
                    problems.append(
                        f"{family} {kind} rank {rank}: extra {sorted(names - set(want))[:4]}, "
                        f"missing {sorted(set(want) - names)[:4]}"
                    )
                    continue
                for name, arr in want.items():
                    if got[name].numpy().tobytes() != np.ascontiguousarray(arr).tobytes():
                        problems.append(
                            f"{family} {kind} rank {rank}: {name} differs "
                            f"(shape {got['__shapes__'][name]} vs {arr.shape})"
                        )
    assert not problems, "\n".join(problems[:20])


def test_every_family_loads_exactly_at_tp2(miniatures: dict[str, Path], tmp_path: Path) -> None:
    load_all(miniatures, tmp_path / "out", 2, 1)
    check(miniatures, tmp_path / "out", 2, 1)


@pytest.mark.slow
@pytest.mark.parametrize("tp,ep", [(1, 1), (4, 1), (2, 2)])
def test_every_family_loads_exactly(
    miniatures: dict[str, Path], tmp_path: Path, tp: int, ep: int
) -> None:
    load_all(miniatures, tmp_path / "out", tp, ep)
    check(miniatures, tmp_path / "out", tp, ep)


CONFIGS = {
    "deepseek-v3": "deepseek-v3+fp8-block",
    "deepseek-v4": "deepseek-v4+fp8-block+mxfp4",
    "gpt-oss": "gpt-oss+mxfp4",
    "nvfp4": "deepseek-v3+nvfp4",
    "qwen3-fp8": "qwen3+fp8-block",
    "llama": "llama+bf16",
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_loads_from_the_command_line_as_readme_shows(
    miniatures: dict[str, Path], family: str
) -> None:
    """README's one command per family: `torchrun -m tpload DIR`, the config picked and said."""
    run = tpload_cli(2, str(miniatures[family]), "--kind", "expanded")
    assert run.rc == 0, run.text[-3000:]
    assert f"config {CONFIGS[family]}: config.json architectures" in run.text
    assert "verified:" in run.out

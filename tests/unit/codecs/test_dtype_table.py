"""The seed's dtype table (I64 as stored, F16 served as BF16 with round-to-nearest-even, anything
else refused by name) and numeric name order in plans, ep ownership and digests."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import tpload
from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.tools.synth import SynthSpec, write_checkpoint

from ...ckpt_tools import add_tensors, stored_bytes

# f16 values whose f32 lies exactly between two bf16 values: ties go to the even mantissa
TIES = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3 * (1 + 5 * 2**-8), 65504.0, 2**-14, -0.0, 0.1]


def natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_checkpoint(tmp_path_factory.mktemp("mixed"), SynthSpec(experts=12))
    rng = np.random.default_rng(3)
    f16 = np.concatenate(
        [np.array(TIES, dtype=np.float16), rng.standard_normal(120).astype(np.float16)]
    )
    add_tensors(
        root,
        {
            "extra.token_ids": torch.tensor(
                [0, -1, 2**40 + 7, -(2**62), 2**63 - 1], dtype=torch.int64
            ),
            "extra.f16": torch.from_numpy(f16.reshape(16, 8)),
            "extra.2.weight": torch.ones(4, dtype=torch.bfloat16),
            "extra.10.weight": torch.zeros(4, dtype=torch.bfloat16),
        },
    )
    return root


def fingerprint(raw: bytes, rows: int) -> tuple[int, int, int]:
    """README "Digests", written out with numpy: int64 words (uint8 for 1-byte rows), wrapping
    sums."""
    b = np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)
    if b.size == 0:
        return 0, 0, 0
    w = next(w for w in (8, 4, 2, 1) if b.shape[1] % w == 0)
    x = b.view({8: "<i8", 4: "<i4", 2: "<i2", 1: np.uint8}[w]).astype(np.int64)
    with np.errstate(over="ignore"):
        r, c = x.sum(axis=1), x.sum(axis=0)
        return (
            int(r.sum()),
            int((r * np.arange(1, len(r) + 1)).sum()),
            int((c * np.arange(1, len(c) + 1)).sum()),
        )


def digest_of(sd: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(sd, key=natural):
        t = sd[name]
        rows = t.shape[0] if t.dim() > 1 else 1
        fp = fingerprint(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), rows)
        dtype = str(t.dtype).removeprefix("torch.")
        h.update(f"{name}|{dtype}|{'x'.join(map(str, t.shape))}|{fp[0]}|{fp[1]}|{fp[2]}\n".encode())
    return h.hexdigest()


def test_i64_and_f16_and_numeric_order(mixed: Path) -> None:
    shards = tpload.load(mixed, progress=False)
    sd = shards.state_dict()
    ids = sd["extra.token_ids"]
    assert ids.dtype == torch.int64 and ids.tolist() == [0, -1, 2**40 + 7, -(2**62), 2**63 - 1]
    f16 = sd["extra.f16"]
    assert f16.dtype == torch.bfloat16 and f16.shape == (16, 8)
    raw = np.frombuffer(stored_bytes(mixed, "extra.f16"), np.float16)
    want = (
        raw.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    )  # f16 -> f32 -> bf16, RNE
    np.testing.assert_array_equal(f16.view(torch.int16).numpy().view(np.uint16).ravel(), want)
    assert [float(v) for v in f16.float().ravel()[:3]] == [1.0, 1 + 2**-6, -1.0]  # ties to even
    names = list(sd)
    assert names.index("extra.2.weight") < names.index("extra.10.weight")
    order = [int(n.split(".")[4]) for n in names if n.endswith("w1.weight") and ".experts." in n]
    assert order == list(range(12))  # plan order is numeric: 2 before 10
    assert shards.report.mine.digest == digest_of(sd)  # digest lines in numeric order


def test_expert_groups_count_numerically(mixed: Path) -> None:
    planner = planner_of(read_native(mixed)[0], load_config())
    held = [
        sorted(
            {
                int(i.name.split(".")[4])
                for i in planner.plan(Layout(1, 2), "packed", g).items
                if ".experts." in i.name
            }
        )
        for g in range(2)
    ]
    assert held == [list(range(6)), list(range(6, 12))]  # not 0, 1, 10, 11, 2, 3 (string order)


def test_f64_is_refused_by_name(ckpt_copy: Path) -> None:
    add_tensors(ckpt_copy, {"extra.rope_freqs": torch.ones(8, dtype=torch.float64)})
    with pytest.raises(tpload.LoadError) as e:
        tpload.load(ckpt_copy, progress=False)
    msg = str(e.value)
    assert (
        "extra.rope_freqs (extra.safetensors, F64 [8])" in msg
        and "plain tensors must be BF16/F32/F16/I64" in msg
    )

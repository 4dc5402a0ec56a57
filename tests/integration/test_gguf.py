"""The GGUF miniature (a split set of 2 files written by the gguf package) loaded by real torchrun ranks
at tp 2: packed bytes exactly gguf's reader's, expanded bf16 exactly gguf's dequantisation rounded once;
a flipped byte fails every rank naming the tensor (manifest written by `tpload manifest`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.codecs.tables import round_bf16

from ..helpers import HERE, load_error, torchrun, tpload_cli

gguf = pytest.importorskip("gguf")

# How the config cuts each name at tp 2 (torch order): (axis of the cut, counted in elements), None: whole.
ROWS = ("token_embd.", "output.weight", "attn_q_b", "attn_kv_b", "ffn_gate.", "ffn_up.", "_shexp", "ffn_gate_exps",
        "ffn_up_exps")


def cut_axis(name: str, ndim: int) -> int | None:
    if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_shexp.weight", "ffn_down_exps.weight")):
        return ndim - 1  # along the innermost dimension, on whole blocks
    if any(k in name for k in ROWS):
        return 1 if "_exps" in name else 0
    return None


def expected(root: Path, rank: int, kind: str) -> dict[str, np.ndarray]:
    """Every tensor rank ``rank`` of tp 2 serves, from gguf's own reader and dequantisation."""
    out = {}
    for path in sorted(root.glob("*.gguf")):
        for t in gguf.GGUFReader(path).tensors:
            qtype = t.tensor_type
            elements = tuple(int(d) for d in reversed(t.shape))
            if kind == "expanded" and qtype.name not in ("F32", "F16", "BF16"):
                data = round_bf16(gguf.quants.dequantize(t.data, qtype).reshape(elements)).view(np.int16)
                shape = elements
            else:
                data, shape = np.asarray(t.data), elements
            axis = cut_axis(t.name, len(shape))
            if axis is not None:
                n = data.shape[axis]  # in elements (expanded, F32) or bytes of whole blocks (packed)
                data = np.take(data, range(rank * n // 2, (rank + 1) * n // 2), axis=axis)
            out[t.name] = np.ascontiguousarray(data)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf") / "ds3"
    for cmd in (["synth", str(root), "--preset", "deepseek-v3-gguf-tiny"], ["manifest", str(root)]):
        run = subprocess.run([sys.executable, "-m", "tpload", *cmd], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in root.glob("*.gguf")) == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    return root


def test_tp2_packed_and_expanded_exactly(tiny: Path, tmp_path: Path) -> None:
    run = torchrun(2, [str(HERE / "workers" / "dump.py"), str(tiny), str(tmp_path), "kinds=packed,expanded"],
                   timeout=300)
    assert run.rc == 0, run.text[-4000:]
    problems = []
    for kind in ("packed", "expanded"):
        for rank in range(2):
            got = torch.load(tmp_path / f"{kind}-rank{rank}.pt")
            want = expected(tiny, rank, kind)
            assert set(got) == set(want), (kind, rank, set(got) ^ set(want))
            for name, arr in want.items():
                mine = got[name]
                if mine.dtype == torch.bfloat16:
                    mine = mine.view(torch.int16)
                if tuple(mine.shape) != arr.shape or mine.numpy().tobytes() != arr.tobytes():
                    problems.append(f"{kind} rank {rank}: {name} {tuple(mine.shape)} vs {arr.shape}")
    assert not problems, "\n".join(problems)
    got = torch.load(tmp_path / "packed-rank1.pt")["blk.1.ffn_down_exps.weight"]
    assert got.dtype == torch.uint8 and tuple(got.shape) == (4, 256, 144)  # [E, rows, one Q4_K block of 2]


def test_flipped_byte_fails_every_rank(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    part = bad / "model-00002-of-00002.gguf"
    t = next(t for t in gguf.GGUFReader(part).tensors if t.name == "blk.1.ffn_up_exps.weight")
    raw = bytearray(part.read_bytes())
    raw[int(t.data_offset) + 7] ^= 0x10  # a quant byte of expert 0's first block: rank 0's rows
    part.write_bytes(bytes(raw))
    run = tpload_cli(2, str(bad), "--tp", "2", timeout=300, logs=tmp_path / "logs")
    assert run.rc != 0
    _, message = load_error(run)
    assert "blk.1.ffn_up_exps.weight" in message and "sha256" in message, message


def test_nan_super_scale_refused_naming_tensor_and_block(tiny: Path, tmp_path: Path) -> None:
    """A block whose f16 d is NaN, vouched for by a fresh manifest: the value check refuses it."""
    bad = tmp_path / "nan"
    bad.mkdir()
    for f in tiny.glob("*.gguf"):
        (bad / f.name).write_bytes(f.read_bytes())
    part = bad / "model-00002-of-00002.gguf"
    t = next(t for t in gguf.GGUFReader(part).tensors if t.name == "blk.1.ffn_gate_exps.weight")
    raw = bytearray(part.read_bytes())
    at = int(t.data_offset) + 144 * 3  # block 3 of the first row: its d
    raw[at:at + 2] = np.array([np.nan], np.float16).tobytes()
    part.write_bytes(bytes(raw))
    for cmd in (["manifest", str(bad)], ["verify", str(bad)]):
        run = subprocess.run([sys.executable, "-m", "tpload", *cmd], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert ("tensor blk.1.ffn_gate_exps.weight: 1 Q4_K blocks whose f16 scale (d/dmin) is NaN or infinite "
            "(first: view row 0, block 3 of the row)") in run.stdout + run.stderr, run.stdout + run.stderr

"""The GGUF miniature (a split set of 2 files written by the gguf package) loaded by real torchrun
ranks at tp 2: packed bytes exactly gguf's reader's, expanded bf16 exactly gguf's dequantisation
rounded once; a flipped byte fails every rank naming the tensor (manifest written by `tpload
manifest`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.cli import main
from tpload.codecs.tables import round_bf16

from ..helpers import HERE, load_error, torchrun, tpload_cli

gguf = pytest.importorskip("gguf")

# How the shipped configs cut each name (torch order): rows, or the innermost dimension; others
# whole.
ROWS = re.compile(
    r"(token_embd|output)\.weight|blk\.\d+\.(attn_q_b|attn_kv_b|attn_[qkv]|ffn_gate|ffn_up|"
    r"ffn_gate_shexp|ffn_up_shexp|ffn_gate_exps|ffn_up_exps)\.weight"
)
INNERMOST = re.compile(r"blk\.\d+\.(attn_output|ffn_down|ffn_down_shexp|ffn_down_exps)\.weight")


def expected(root: Path, tp: int, ep: int, rank: int, kind: str) -> dict[str, np.ndarray]:
    """Every tensor rank ``rank`` of tp x ep serves, from gguf's own reader and dequantisation."""
    group, tpr = divmod(rank, tp)
    out = {}
    for path in sorted(root.glob("*.gguf")):
        for t in gguf.GGUFReader(path).tensors:
            qtype = t.tensor_type
            elements = tuple(int(d) for d in reversed(t.shape))
            if kind == "expanded" and qtype.name not in ("F32", "F16", "BF16"):
                data = round_bf16(gguf.quants.dequantize(t.data, qtype).reshape(elements)).view(
                    np.int16
                )
            else:
                data = np.asarray(t.data)
            stacked = "_exps." in t.name
            axis = (
                int(stacked)
                if ROWS.fullmatch(t.name)
                else data.ndim - 1
                if INNERMOST.fullmatch(t.name)
                else None
            )
            if axis is not None:
                n = data.shape[
                    axis
                ]  # in elements (expanded, F32) or bytes of whole blocks (packed)
                data = np.take(data, range(tpr * n // tp, (tpr + 1) * n // tp), axis=axis)
            if stacked:  # ep shares the experts
                e = data.shape[0]
                data = data[group * e // ep : (group + 1) * e // ep]
            out[t.name] = np.ascontiguousarray(data)
    return out


def load_and_check(roots: dict[str, Path], out: Path, tp: int, ep: int) -> None:
    """Both miniatures, both kinds, every rank of tp x ep in one launch: every served tensor
    exactly."""
    out.mkdir()
    run = torchrun(
        tp * ep,
        [
            str(HERE / "workers" / "families.py"),
            str(out),
            str(tp),
            str(ep),
            *(f"{k}={v}" for k, v in roots.items()),
        ],
        timeout=600,
    )
    assert run.rc == 0, run.text[-4000:]
    problems = []
    for label, root in roots.items():
        for kind in ("packed", "expanded"):
            for rank in range(tp * ep):
                got = torch.load(out / f"{label}-{kind}-rank{rank}.pt")
                want = expected(root, tp, ep, rank, kind)
                names = set(got) - {"__shapes__", "__config__"}
                assert names == set(want), (label, kind, rank, names ^ set(want))
                for name, arr in want.items():
                    if (
                        tuple(got["__shapes__"][name]) != arr.shape
                        or got[name].numpy().tobytes() != arr.tobytes()
                    ):
                        problems.append(
                            f"{label} {kind} rank {rank}: {name} {got['__shapes__'][name]} vs "
                            f"{arr.shape}"
                        )
    assert not problems, "\n".join(problems[:20])


def synth(root: Path, preset: str) -> Path:
    # the command line's own entry point, in this process (a process each cost seconds of imports)
    for cmd in (["synth", str(root), "--preset", preset], ["manifest", str(root)]):
        assert main(cmd) == 0, cmd
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = synth(tmp_path_factory.mktemp("gguf") / "ds3", "deepseek-v3-gguf-tiny")
    assert sorted(p.name for p in root.glob("*.gguf")) == [
        "model-00001-of-00002.gguf",
        "model-00002-of-00002.gguf",
    ]
    return root


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth(tmp_path_factory.mktemp("gguf") / "qwen", "qwen3-moe-gguf-tiny")


def test_tp2_packed_and_expanded_exactly(tiny: Path, qwen: Path, tmp_path: Path) -> None:
    load_and_check({"ds3": tiny, "qwen": qwen}, tmp_path / "out", 2, 1)
    got = torch.load(tmp_path / "out" / "ds3-packed-rank1.pt")
    assert got["__shapes__"]["blk.1.ffn_down_exps.weight"] == (
        4,
        256,
        144,
    )  # [E, rows, one Q4_K block of 2]


@pytest.mark.slow
def test_tp2_ep2_exactly(tiny: Path, qwen: Path, tmp_path: Path) -> None:
    load_and_check({"ds3": tiny, "qwen": qwen}, tmp_path / "out", 2, 2)


# A manifest mismatch found by one rank failing every rank is the quick tier's launch of
# tests/integration/test_consensus.py; a flipped GGUF quant byte caught by its tensor's sha256 is
# unit-tested in-process (tests/unit/storage/test_gguf_checkpoint.py): this launch is the slow
# tier's.
@pytest.mark.slow
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


def test_nan_super_scale_refused_naming_tensor_and_block(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A block whose f16 d is NaN, vouched for by a fresh manifest: the value check refuses it."""
    bad = tmp_path / "nan"
    bad.mkdir()
    for f in tiny.glob("*.gguf"):
        (bad / f.name).write_bytes(f.read_bytes())
    part = bad / "model-00002-of-00002.gguf"
    t = next(t for t in gguf.GGUFReader(part).tensors if t.name == "blk.1.ffn_gate_exps.weight")
    raw = bytearray(part.read_bytes())
    at = int(t.data_offset) + 144 * 3  # block 3 of the first row: its d
    raw[at : at + 2] = np.array([np.nan], np.float16).tobytes()
    part.write_bytes(bytes(raw))
    for cmd in (["manifest", str(bad)], ["verify", str(bad)]):  # in this process, as synth()
        capsys.readouterr()
        rc = main(cmd)
    said = capsys.readouterr()
    assert rc != 0
    assert (
        "tensor blk.1.ffn_gate_exps.weight: 1 Q4_K blocks whose f16 scale (d/dmin) is NaN or "
        "infinite (first: view row 0, block 3 of the row)"
    ) in said.out + said.err, said.out + said.err

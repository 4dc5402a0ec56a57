"""The gguf codec: decodes (compiled kernel, torch ops) against the gguf package's dequantisation
(the kernel's two implementations each: tests/unit/kernels/test_gguf.py), windows on whole blocks,
the NaN/inf super-scale check, and --config auto from a GGUF header."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.codecs.gguf import BLOCKS, DECODED, SCALE_OFFSETS, decode_torch
from tpload.codecs.registry import for_role
from tpload.codecs.tables import round_bf16
from tpload.model.meta import TensorMeta

try:
    import gguf
except ImportError:  # the GPU machine may lack it: its device test needs only the kernel
    gguf = None
needs_gguf = pytest.mark.skipif(
    gguf is None, reason="needs the gguf package (pip install -e '.[test]')"
)
CODEC = for_role("gguf")


def blocks(ggml: str, rows: int, per_row: int, seed: int = 0) -> np.ndarray:
    """Random blocks with finite f16 super-scales (of both signs, some large): valid blocks."""
    rng = np.random.default_rng(seed)
    per, size = BLOCKS[ggml]
    raw = rng.integers(0, 256, (rows * per_row, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[ggml]:
        d = (
            rng.uniform(-2.0, 2.0, raw.shape[0]) * 10.0 ** rng.integers(-4, 3, raw.shape[0])
        ).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, per_row * size)


def dequantized(ggml: str, raw: np.ndarray) -> np.ndarray:
    """The gguf package's dequantisation of ``raw`` rounded once to bf16, as int16 bits."""
    return round_bf16(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml])).view(np.int16)


@needs_gguf
@pytest.mark.parametrize("ggml", DECODED)
def test_torch_decodes_equal_gguf_dequantize_rounded_once(ggml: str) -> None:
    # the compiled kernels (both implementations): tests/unit/kernels/test_gguf.py
    raw = blocks(ggml, 5, 3)
    ops = torch.empty((5, 3 * BLOCKS[ggml][0]), dtype=torch.bfloat16)
    decode_torch(ggml, torch.from_numpy(raw), ops)
    assert np.array_equal(ops.view(torch.int16).numpy(), dequantized(ggml, raw))


def meta(ggml: str, shape: tuple[int, ...]) -> TensorMeta:
    per, size = BLOCKS[ggml]
    return TensorMeta(
        "blk.0.ffn_down_exps.weight", "m.gguf", ggml, shape[:-1] + (shape[-1] // per * size,)
    )


def test_windows_on_whole_blocks() -> None:
    fit = CODEC.fit(meta("Q4_K", (4, 8, 1024)), None, split="cols", stacked=True)
    w, _ = CODEC.window(fit, "cols", 4, 3)
    assert w.shape == (4, 8, 144) and w.cols == (
        3 * 144,
        4 * 144,
    )  # the last of 4 blocks, every expert row
    assert CODEC.decoded_shape(fit, w) == (4, 8, 256)
    w, _ = CODEC.window(fit, "cols", 2, 1, experts=(2, 4))
    assert w.shape == (2, 8, 288) and w.rows == (16, 32)
    why = CODEC.window(fit, "cols", 8, 0)
    assert (
        isinstance(why, str) and "256-weight block boundaries" in why and "tp 1, 2, 4 work" in why
    )
    rows = CODEC.fit(meta("Q8_0", (6, 64)), None, split="rows")
    w, _ = CODEC.window(rows, "rows", 3, 2)  # rows cut anywhere
    assert w.rows == (4, 6) and w.shape == (2, 68)


def test_every_type_is_served_expanded() -> None:
    assert tuple(BLOCKS) == DECODED
    fit = CODEC.fit(meta("Q3_K", (4, 256)), None)
    w, _ = CODEC.window(fit, "replicate", 1, 0)
    assert CODEC.served(fit, w, None, "packed")[0][1:3] == (torch.uint8, (4, 110))
    assert CODEC.served(fit, w, None, "expanded")[0][1:] == (torch.bfloat16, (4, 256), 4 * 256 * 2)


@needs_gguf
@pytest.mark.parametrize("ggml", ["Q2_K", "Q3_K", "Q4_K"])
@pytest.mark.parametrize("split, experts", [("cols", (1, 3)), ("rows", (0, 3))])
def test_expert_windows_decode_as_the_slice_of_the_whole(
    ggml: str, split: str, experts: tuple[int, int]
) -> None:
    """A stacked [3, 6, 3 blocks] tensor: rank 1 of tp 3 (its middle block, or rows 2-3), two of the
    experts, decoded the way the load does (view rows, unfolded per expert) by the kernel and the
    torch ops: the matching slice of gguf's dequantisation of the whole tensor."""
    from tpload.codecs.base import decode_rows

    per = BLOCKS[ggml][0]
    raw = blocks(ggml, 3 * 6, 3, seed=7)
    whole = dequantized(ggml, raw).reshape(3, 6, -1)
    fit = CODEC.fit(meta(ggml, (3, 6, 3 * per)), None, split=split, stacked=True)
    w, _ = CODEC.window(fit, split, 3, 1, experts=experts)
    e0, e1 = experts
    want = whole[e0:e1, :, per : 2 * per] if split == "cols" else whole[e0:e1, 2:4]
    assert CODEC.decoded_shape(fit, w) == want.shape
    view = raw.reshape(-1).reshape(w.view)[w.rows[0] : w.rows[1], w.cols[0] : w.cols[1]]
    unfold = w.row_bytes // CODEC.decode_row_bytes(fit, w)
    for decode, src in (
        (CODEC.decode, view),
        (CODEC.reference, view),
        (CODEC.decode, torch.from_numpy(view)),
    ):
        out = torch.empty(want.shape, dtype=torch.bfloat16)
        decode_rows(decode, fit, unfold, src, None, out.reshape(view.shape[0], -1), None)
        assert np.array_equal(out.view(torch.int16).numpy(), want)


@pytest.mark.parametrize("ggml", ["Q4_K", "Q8_0", "Q2_K", "Q3_K"])
def test_nan_or_inf_super_scale_is_refused_naming_the_block(ggml: str) -> None:
    raw = blocks(ggml, 3, 2)
    size = BLOCKS[ggml][1]
    off = SCALE_OFFSETS[ggml][-1]
    raw[1, size + off : size + off + 2] = np.array([np.inf], np.float16).view(
        np.uint8
    )  # row 1, block 1
    raw[2, off : off + 2] = np.array([np.nan], np.float16).view(np.uint8)
    fit = CODEC.fit(TensorMeta("t", "m.gguf", ggml, raw.shape), None)
    w, _ = CODEC.window(fit, "replicate", 1, 0)
    check = CODEC.checker(fit, w, None)
    check.weight(raw[:1], 0)
    check.weight(raw[1:], 1)
    ((count, what, name),) = check.problems()
    assert (
        (count, name) == (2, "t")
        and "first: view row 1, block 1" in what
        and "NaN or infinite" in what
    )


@needs_gguf
def test_config_auto_reads_the_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpload.loading.pick import choose
    from tpload.tools.synth_gguf import write_gguf_preset

    root = write_gguf_preset(tmp_path / "g", "deepseek-v3-gguf-tiny")
    config, why = choose("auto", root)
    assert config.name == "deepseek-v3-gguf+gguf" and "gguf:deepseek2" in why
    from tpload.loading.pick import model_config

    model = model_config(root)
    assert (
        model["num_attention_heads"],
        model["num_hidden_layers"],
        model["n_routed_experts"],
    ) == (4, 2, 4)
    from tpload.cli import main

    capsys.readouterr()
    assert main(["plan", str(root), "--tp", "4"]) != 0  # the command line, in this process
    err = capsys.readouterr().err
    assert "blk.1.ffn_down_exps.weight" in err and "tp 1, 2 work" in err, err


def test_preset_without_gguf_says_so(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['gguf'] = None; from tpload.cli import main; "
        f"sys.exit(main(['synth', {str(tmp_path / 'x')!r}, '--preset', 'deepseek-v3-gguf-tiny']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "which is not installed (pip install gguf, or in tpload's clone pip install -e "
            "'.[gguf]')"
        )
    ), run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (launch/gpu-check.sh --only gguf)"
)
@pytest.mark.parametrize("ggml", DECODED)
def test_device_decode_equals_the_kernel(ggml: str) -> None:
    from tpload.kernels.lazy import kernels

    raw = blocks(ggml, 64, 8, seed=3)
    per = BLOCKS[ggml][0]
    kernel = torch.empty((64, 8 * per), dtype=torch.bfloat16)
    kernels.decode_gguf(ggml, raw, kernel.view(torch.int16).numpy())
    device = torch.empty((64, 8 * per), dtype=torch.bfloat16, device="cuda")
    decode_torch(ggml, torch.from_numpy(raw).cuda(), device)
    assert torch.equal(device.cpu().view(torch.int16), kernel.view(torch.int16))

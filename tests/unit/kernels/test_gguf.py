"""GGUF's decodes (kernels/gguf.py), each implementation (numba's, and the same compiled ahead):
bit for bit the ``gguf`` package's numpy dequantisation rounded once to bf16, and what they refuse
(they run without bounds checks)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.codecs.test_gguf import blocks, dequantized, needs_gguf
from tpload.kernels.calls import GGUF_BLOCKS, Kernels

pytestmark = pytest.mark.usefixtures("implementation")  # numba's kernels, then ahead-of-time


@needs_gguf
@pytest.mark.parametrize("ggml", GGUF_BLOCKS)
def test_decodes_equal_gguf_dequantize_rounded_once(implementation: Kernels, ggml: str) -> None:
    raw = blocks(ggml, 5, 3)
    out = np.zeros((5, 3 * GGUF_BLOCKS[ggml][0]), np.int16)
    implementation.decode_gguf(ggml, raw, out)
    np.testing.assert_array_equal(out, dequantized(ggml, raw))
    # read-only blocks and unsigned words, rows of a stacked [experts, rows, ...] tensor
    ro = raw.reshape(5, 1, -1)
    ro.flags.writeable = False
    words = np.zeros((5, 1, out.shape[1]), np.uint16)
    implementation.decode_gguf(ggml, ro, words)
    np.testing.assert_array_equal(words.reshape(out.shape).view(np.int16), out)


def test_what_a_kernel_could_overrun_is_refused(implementation: Kernels) -> None:
    raw = blocks("Q4_K", 3, 2)
    out = np.zeros((3, 512), np.int16)
    for bad_out, why in (
        (np.zeros((3, 256), np.int16), "disagree"),
        (out[:2], "disagree"),
        (np.zeros((512, 3), np.int16).T, "contiguous"),
        (np.zeros((3, 512), np.int32), "16-bit"),
    ):
        with pytest.raises(ValueError, match=why):
            implementation.decode_gguf("Q4_K", raw, bad_out)
    with pytest.raises(ValueError, match="whole 144-byte blocks"):
        implementation.decode_gguf("Q4_K", raw[:, :200], out)
    with pytest.raises(ValueError, match="uint8"):
        implementation.decode_gguf("Q4_K", raw.view(np.int8), out)
    with pytest.raises(ValueError, match="no kernel for Q4_0"):
        implementation.decode_gguf("Q4_0", raw, out)
    implementation.decode_gguf("Q4_K", raw, out)
    strided = np.zeros_like(out)
    implementation.decode_gguf("Q4_K", np.repeat(raw, 2, axis=0)[::2], strided)  # rows far apart
    np.testing.assert_array_equal(strided, out)

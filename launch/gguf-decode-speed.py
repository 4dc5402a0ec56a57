"""GGUF -> bf16 decode speed against a plain copy: the numba kernel (one thread) and the torch ops
(the device path; on the CPU here, on cuda:0 with --cuda), in bf16 bytes out, beside a memcpy of as
many bytes (the fp8/fp4 figure's measure, README). Not a test: `python launch/gguf-decode-speed.py
[TYPE]` (TYPE one of Q8_0, Q2_K ... Q6_K; Q4_K when none)."""

import sys
import time

import numpy as np
import torch

from tpload.codecs.gguf import BLOCKS as GGUF_BLOCKS
from tpload.codecs.gguf import SCALE_OFFSETS as GGUF_SCALE_OFFSETS
from tpload.codecs.gguf import decode_torch as gguf_decode_torch
from tpload.kernels.gguf import decode as gguf_decode_kernel

ggml = next((a for a in sys.argv[1:] if not a.startswith("-")), "Q4_K")
per, size = GGUF_BLOCKS[ggml]
rows, nb = 8192, 7168 // per  # 8192 rows x 7168 weights: 117 MB of bf16 out
rng = np.random.default_rng(0)
src = rng.integers(0, 256, (rows, nb * size), dtype=np.uint8)
blocks = src.reshape(rows, nb, size)
for off in GGUF_SCALE_OFFSETS[ggml]:  # finite super-scales
    blocks[:, :, off : off + 2] = np.array([1e-3], np.float16).view(np.uint8)
out = np.empty((rows, nb * per), np.int16)
gguf_decode_kernel(ggml, src, out)


def best(f, n=7):
    t = []
    for _ in range(n):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    return min(t)


big = np.empty(out.nbytes, np.uint8)
big2 = np.ones_like(big)
tc = best(lambda: np.copyto(big, big2))
td = best(lambda: gguf_decode_kernel(ggml, src, out))
dev = "cuda" if "--cuda" in sys.argv else "cpu"
src_d, out_d = (
    torch.from_numpy(src).to(dev),
    torch.empty(out.shape, dtype=torch.bfloat16, device=dev),
)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
tt = best(lambda: (gguf_decode_torch(ggml, src_d, out_d), sync()), 3)
mb = src.nbytes / 1e6
ob = out.nbytes / 1e9
print(
    f"{ggml} -> bf16, {ob:.3f} GB out, 1 thread, bf16 bytes out: numba {ob / td:.2f} GB/s "
    f"({tc / td:.0%} of memcpy), torch ops on {dev} {ob / tt:.2f} GB/s; memcpy of the same output "
    f"{ob / tc:.2f} GB/s"
)

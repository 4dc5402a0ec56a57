"""GGUF -> bf16 decode speed against a plain copy: the compiled kernels (one thread; numba's, and
the ones compiled ahead where `python -m tpload kernels` built them) and the torch ops (the device
path; on the CPU here, on cuda:0 with --cuda), in bf16 bytes out, beside a memcpy of as many bytes
(the fp8/fp4 figure's measure, README). Not a test: `python launch/gguf-decode-speed.py [TYPE]`
(TYPE one of Q8_0, Q2_K ... Q6_K; Q4_K when none)."""

import sys
import time

import numpy as np
import torch

from tpload.codecs.gguf import BLOCKS as GGUF_BLOCKS
from tpload.codecs.gguf import SCALE_OFFSETS as GGUF_SCALE_OFFSETS
from tpload.codecs.gguf import decode_torch as gguf_decode_torch
from tpload.kernels import ahead, compiled

ggml = next((a for a in sys.argv[1:] if not a.startswith("-")), "Q4_K")
per, size = GGUF_BLOCKS[ggml]
rows, nb = 8192, 7168 // per  # 8192 rows x 7168 weights: 117 MB of bf16 out
rng = np.random.default_rng(0)
src = rng.integers(0, 256, (rows, nb * size), dtype=np.uint8)
blocks = src.reshape(rows, nb, size)
for off in GGUF_SCALE_OFFSETS[ggml]:  # finite super-scales
    blocks[:, :, off : off + 2] = np.array([1e-3], np.float16).view(np.uint8)
out = np.empty((rows, nb * per), np.int16)
implementations = [compiled.KERNELS, *filter(None, [ahead.load()])]


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
decoded = []
for kernels in implementations:
    kernels.decode_gguf(ggml, src, out)  # numba's: its import and load, outside the timing
    decoded.append(out.copy())
td = {k.implementation: best(lambda k=k: k.decode_gguf(ggml, src, out)) for k in implementations}
assert all(np.array_equal(d, decoded[0]) for d in decoded)
dev = "cuda" if "--cuda" in sys.argv else "cpu"
src_d, out_d = (
    torch.from_numpy(src).to(dev),
    torch.empty(out.shape, dtype=torch.bfloat16, device=dev),
)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
tt = best(lambda: (gguf_decode_torch(ggml, src_d, out_d), sync()), 3)
mb = src.nbytes / 1e6
ob = out.nbytes / 1e9
kernel = ", ".join(f"{name} {ob / t:.2f} GB/s ({tc / t:.0%} of memcpy)" for name, t in td.items())
print(
    f"{ggml} -> bf16, {ob:.3f} GB out, 1 thread, bf16 bytes out: {kernel}, torch ops on {dev} "
    f"{ob / tt:.2f} GB/s; memcpy of the same output {ob / tc:.2f} GB/s"
)

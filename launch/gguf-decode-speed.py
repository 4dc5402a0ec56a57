"""Q4_K -> bf16 decode speed against a plain copy: the numba kernel (one thread) and the torch ops (the
device path; on the CPU here, on cuda:0 with --cuda), in bf16 bytes out, beside a memcpy of as many
bytes (the fp8/fp4 figure's measure, README). Not a test: `python launch/gguf-decode-speed.py`."""
import sys
import time, numpy as np, torch
from tpload.codecs import gguf_kernels
from tpload.codecs.gguf import decode_torch
rows, nb = 8192, 28  # 8192 rows x 7168 weights: 117 MB of bf16 out
rng = np.random.default_rng(0)
src = rng.integers(0, 256, (rows, nb * 144), dtype=np.uint8)
for r in range(rows):
    src[r].reshape(nb, 144)[:, 0:4] = np.array([1e-3, 1e-3], np.float16).view(np.uint8)
out = np.empty((rows, nb * 256), np.int16)
dst = np.empty_like(src)
gguf_kernels.decode("Q4_K", src, out)
def best(f, n=7):
    t = []
    for _ in range(n):
        a = time.perf_counter(); f(); t.append(time.perf_counter() - a)
    return min(t)
big = np.empty(out.nbytes, np.uint8); big2 = np.ones_like(big)
tc = best(lambda: np.copyto(big, big2))
td = best(lambda: gguf_kernels.decode("Q4_K", src, out))
dev = "cuda" if "--cuda" in sys.argv else "cpu"
src_d, out_d = torch.from_numpy(src).to(dev), torch.empty(out.shape, dtype=torch.bfloat16, device=dev)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
tt = best(lambda: (decode_torch("Q4_K", src_d, out_d), sync()), 3)
mb = src.nbytes / 1e6
ob = out.nbytes / 1e9
print(f"Q4_K -> bf16, {ob:.3f} GB out, 1 thread, bf16 bytes out: numba {ob / td:.2f} GB/s ({tc / td:.0%} of memcpy), "
      f"torch ops on {dev} {ob / tt:.2f} GB/s; memcpy of the same output {ob / tc:.2f} GB/s")

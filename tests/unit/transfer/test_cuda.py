"""CUDA-only paths: chunked pinned staging on a side stream, device decodes, a whole load on one GPU.

Skipped without CUDA; ``launch/gpu-check.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tpload
from tpload import formats, load
from tpload.verify import as_bytes2d, fingerprint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = torch.device("cuda", 0)


def test_stager_sends_strided_windows_in_chunks_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "PINNED_CHUNK_BYTES", 4096)  # many chunks through both pinned buffers
    host = np.random.default_rng(0).integers(0, 256, (300, 1000), dtype=np.uint8)
    windows = [host[:, 100:600], host[7:290, :], host[:1, :17]]
    with load.Stager(DEV, max(w.nbytes for w in windows)) as stager:
        dsts = [torch.empty(w.shape, dtype=torch.uint8, device=DEV) for w in windows]
        got = [stager.put(w, d) for w, d in zip(windows, dsts)] + [stager.put(w) for w in windows]
        fps = [fingerprint(g) for g in got]
    for g, fp, w in zip(got, fps, windows + windows):
        np.testing.assert_array_equal(g.cpu().numpy(), w)
        assert fp.tolist() == fingerprint(torch.from_numpy(np.ascontiguousarray(w))).tolist()


def test_device_decodes_equal_host_decodes() -> None:
    rng = np.random.default_rng(1)
    packed = torch.from_numpy(rng.integers(0, 256, (64, 512), dtype=np.uint8))
    scale = torch.from_numpy(rng.integers(100, 150, (64, 32), dtype=np.uint8))
    cpu, gpu = torch.empty(64, 1024, dtype=torch.bfloat16), torch.empty(64, 1024, dtype=torch.bfloat16, device=DEV)
    formats.decode_fp4(packed, scale, cpu)
    formats.decode_fp4(packed.to(DEV), scale.to(DEV), gpu)
    assert torch.equal(gpu.cpu().view(torch.int16), cpu.view(torch.int16))
    w = torch.from_numpy(rng.integers(0, 0x7E, (96, 320), dtype=np.uint8))
    s = torch.from_numpy(rng.integers(110, 140, (3, 10), dtype=np.uint8))
    cpu, gpu = torch.empty(96, 320, dtype=torch.bfloat16), torch.empty(96, 320, dtype=torch.bfloat16, device=DEV)
    formats.decode_fp8(w, s, cpu, block=32)
    formats.decode_fp8(w.to(DEV), s.to(DEV), gpu, block=32)
    assert torch.equal(gpu.cpu().view(torch.int16), cpu.view(torch.int16))


@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_a_gpu_load_serves_the_bytes_and_digest_of_a_cpu_load(small_ckpt: Path, kind: str) -> None:
    on_gpu = tpload.load(small_ckpt, kind=kind, device=DEV, progress=False)
    on_cpu = tpload.load(small_ckpt, kind=kind, device="cpu", progress=False)
    g, c = on_gpu.state_dict(), on_cpu.state_dict()
    assert set(g) == set(c)
    for name in c:
        assert g[name].device.type == "cuda"
        assert torch.equal(as_bytes2d(g[name]).cpu(), as_bytes2d(c[name])), name
    assert on_gpu.report.mine.digest == on_cpu.report.mine.digest  # fingerprints are device independent
    assert on_gpu.report.mine.device_alloc_peak > 0
    on_gpu.release()
    on_cpu.release()

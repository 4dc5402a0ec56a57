"""The CUDA transfer. Its logic (two pinned buffers guarded by events, copies on a side stream,
device fingerprints checked against the host window, torch decodes on the device) runs here on the
CPU with a stand-in stream and pinned allocator, through the same load loop; the tests marked for
CUDA run it on a GPU (launch/gpu-check.sh)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch

import tpload
from tpload.codecs.fp4_e8m0 import FP4
from tpload.codecs.fp8_block import FP8
from tpload.kernels.fingerprint import HostFingerprint, as_bytes2d, host_fingerprint
from tpload.loading.loop import run
from tpload.loading.planner import planner_of
from tpload.model.progress import Silent
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.sources.hashing import Hasher
from tpload.sources.storage import StorageSource
from tpload.storage.sharded import ShardedStorage
from tpload.transfer.cpu import CpuTransfer
from tpload.transfer.cuda import Backend, CudaTransfer
from tpload.verification.node import HashPlan

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class StandInEvent:
    """Counts what the transfer asks of its events, so the tests can see the buffers being
    guarded."""

    def __init__(self) -> None:
        self.recorded = self.waited = 0

    def record(self, stream: object) -> None:
        self.recorded += 1

    def synchronize(self) -> None:
        self.waited += 1


class StandInStream:
    def synchronize(self) -> None:
        pass


def stand_in() -> Backend:
    return Backend(
        pinned=lambda n: torch.empty(n, dtype=torch.uint8),
        stream=StandInStream,
        event=StandInEvent,
        on_stream=lambda s: contextlib.nullcontext(),
    )


def test_blocks_go_through_both_pinned_buffers_and_arrive_exactly() -> None:
    t = CudaTransfer(torch.device("cpu"), stand_in(), chunk_bytes=4096)
    host = np.random.default_rng(0).integers(0, 256, (64, 1000), dtype=np.uint8)
    window = host[:, 100:600]  # a column window: rows are strided in the staging buffer
    slot = torch.empty(window.shape, dtype=torch.uint8)
    fp = HostFingerprint(window.shape[1])
    with t:
        for r0 in range(0, 64, 8):
            t.copy(window[r0 : r0 + 8], slot[r0 : r0 + 8], fp, r0, 0)
        served, want = t.served(slot, fp)
    assert np.array_equal(slot.numpy(), window)
    assert (
        tuple(served.tolist()) == want == host_fingerprint(window)
    )  # device fingerprint == host window's
    assert [e.recorded for e in t.events] == [4, 4] and [e.waited for e in t.events] == [4, 4]


def test_a_block_wider_than_a_pinned_buffer_grows_it() -> None:
    t = CudaTransfer(torch.device("cpu"), stand_in(), chunk_bytes=1024)
    block = np.arange(3000, dtype=np.uint8).reshape(1, 3000)
    slot = torch.empty(1, 3000, dtype=torch.uint8)
    with t:
        t.copy(block, slot, HostFingerprint(3000), 0, 0)
    assert np.array_equal(slot.numpy(), block)


def _load_with(
    transfer: object, root: Path, kind: str, tp: int, rank: int, config: str | None = None
) -> tuple[str, dict]:
    storage = ShardedStorage(root)
    try:
        cfg = load_config(config) if config else load_config()
        plan = planner_of(storage.catalogue, cfg).plan(Layout(tp), kind, rank)
        result = run(
            StorageSource(storage),
            plan,
            transfer=transfer,
            hasher=Hasher(HashPlan(rank, frozenset(plan.used_tensors))),
            samples=2,
            progress=Silent(),
            ranks=storage.catalogue.ranks(),
        )
        return result.digest(), {
            n: as_bytes2d(t).cpu().numpy().copy() for n, t in result.tensors.items()
        }
    finally:
        storage.close()


@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_the_cuda_path_on_a_stand_in_serves_what_the_cpu_path_serves(
    small_ckpt: Path, kind: str
) -> None:
    # expanded: the torch decoders (what a GPU runs), fed by stage() and upload(), against the
    # compiled CPU kernels of the CPU path; packed: pinned copies checked by device fingerprints
    cpu_digest, cpu = _load_with(CpuTransfer(torch.device("cpu")), small_ckpt, kind, 2, 1)
    cuda_digest, cuda = _load_with(
        CudaTransfer(torch.device("cpu"), stand_in(), chunk_bytes=8192), small_ckpt, kind, 2, 1
    )
    assert cuda_digest == cpu_digest
    assert set(cuda) == set(cpu) and all(np.array_equal(cuda[n], cpu[n]) for n in cpu)


def test_batches_of_tensors_that_are_not_neighbours_in_the_plan_upload_only_their_slots(
    tmp_path: Path,
) -> None:
    """Tensors dealt to two files in turn: each file's batch holds every other tensor of the plan,
    whose slots interleave in the arena with the other batch's; each batch uploads its own slots
    (not the range between them, which would zero the other's): the bytes the CPU path serves."""
    from tpload.tools.published import write_published

    root = write_published(tmp_path / "d", "many-tensors-alternating", tensors=200)
    cpu_digest, cpu = _load_with(CpuTransfer(torch.device("cpu")), root, "packed", 1, 0, "llama")
    stand = CudaTransfer(torch.device("cpu"), stand_in(), chunk_bytes=8192)
    cuda_digest, cuda = _load_with(stand, root, "packed", 1, 0, "llama")
    assert cuda_digest == cpu_digest and len(cpu) == 200
    assert set(cuda) == set(cpu) and all(np.array_equal(cuda[n], cpu[n]) for n in cpu)


@CUDA
def test_device_decodes_equal_host_decodes() -> None:
    dev = torch.device("cuda", 0)
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (64, 512), dtype=np.uint8)
    scale = rng.integers(100, 150, (64, 32), dtype=np.uint8)
    fit = FP4.fit(*_metas(packed, scale, "I8", "F8_E8M0"))
    cpu, gpu = (
        torch.empty(64, 1024, dtype=torch.bfloat16),
        torch.empty(64, 1024, dtype=torch.bfloat16, device=dev),
    )
    FP4.decode(packed, scale, cpu, fit)
    FP4.decode(torch.from_numpy(packed).to(dev), torch.from_numpy(scale).to(dev), gpu, fit)
    assert torch.equal(gpu.cpu().view(torch.int16), cpu.view(torch.int16))
    w = rng.integers(0, 0x7E, (96, 320), dtype=np.uint8)
    s = rng.integers(110, 140, (3, 10), dtype=np.uint8)
    fit = FP8.fit(*_metas(w, s, "F8_E4M3", "F8_E8M0"))
    cpu, gpu = (
        torch.empty(96, 320, dtype=torch.bfloat16),
        torch.empty(96, 320, dtype=torch.bfloat16, device=dev),
    )
    FP8.decode(w, s, cpu, fit)
    FP8.decode(torch.from_numpy(w).to(dev), torch.from_numpy(s).to(dev), gpu, fit)
    assert torch.equal(gpu.cpu().view(torch.int16), cpu.view(torch.int16))


def _metas(w: np.ndarray, s: np.ndarray, wd: str, sd: str):
    from tpload.model.meta import TensorMeta

    return TensorMeta("x.weight", "f", wd, w.shape), TensorMeta("x.scale", "f", sd, s.shape)


@CUDA
@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_a_gpu_load_serves_the_bytes_and_digest_of_a_cpu_load(small_ckpt: Path, kind: str) -> None:
    on_gpu = tpload.load(small_ckpt, kind=kind, device="cuda:0", progress=False)
    on_cpu = tpload.load(small_ckpt, kind=kind, device="cpu", progress=False)
    g, c = on_gpu.state_dict(), on_cpu.state_dict()
    assert set(g) == set(c)
    for name in c:
        assert g[name].device.type == "cuda"
        assert torch.equal(as_bytes2d(g[name]).cpu(), as_bytes2d(c[name])), name
    assert (
        on_gpu.report.mine.digest == on_cpu.report.mine.digest
    )  # fingerprints are device independent
    assert on_gpu.report.mine.device_alloc_peak > 0 and on_gpu.report.mine.device_checked > 0
    on_gpu.release()
    on_cpu.release()


@CUDA
@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_a_gpu_load_serves_exactly_the_reference(small_ckpt: Path, kind: str) -> None:
    from ...reference import expected

    got = tpload.load(small_ckpt, kind=kind, device="cuda:0", progress=False).state_dict()
    want = expected(small_ckpt, 1, 0, kind)
    assert set(got) == set(want)
    for name, exp in want.items():
        b = (
            got[name]
            .contiguous()
            .view(-1)
            .view(torch.uint8)
            .cpu()
            .numpy()
            .reshape(exp.shape[0], -1)
        )
        np.testing.assert_array_equal(b, exp.view(np.uint8).reshape(exp.shape[0], -1), err_msg=name)


@CUDA
def test_a_flipped_byte_fails_a_gpu_load_naming_the_tensor(ckpt_copy: Path) -> None:
    from ...helpers import poke

    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 1000)
    with pytest.raises(
        tpload.LoadError, match="mtp.0.ffn.experts.3.w1.weight: sha256 .* does not match"
    ):
        tpload.load(ckpt_copy, device="cuda:0", progress=False)

"""One bench run of one method on one rank, started by ``tpload bench`` under torchrun.

    torchrun --nproc-per-node N -m tpload.bench_worker METHOD CHECKPOINT OUT_DIR --tp T [--config C]

Every method does the same job: this rank ends up owning its window of every
tensor (the windows :class:`tpload.plan.Planner` cuts) on its device. The
clock runs from after process-group init (and a barrier) to a final barrier;
the window digest is taken after the clock stops, so checking that every
method served the same bytes costs no method anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.distributed as dist

import tpload

from .pick import choose
from .options import DEFAULT_CONFIG
from .plan import Cut, Item, Layout, Planner, RankPlan
from .report.memory import MemoryPeaks
from .storage.safetensors import ITEMSIZE
from .storage.sharded import ShardedStorage
from .transfer.cpu import new_arena
from .verification.fingerprint import as_bytes2d, digest, fingerprint

Windows = dict[str, torch.Tensor]


class Mapped:
    """The peers' way to the bytes: each shard mapped whole (private, never written), zero-copy views."""

    def __init__(self, root: str) -> None:
        self.storage = ShardedStorage(Path(root).absolute())
        self.catalogue = self.storage.catalogue
        self.manifest = self.catalogue.manifest
        self._maps: dict[Path, np.ndarray] = {}

    def info(self, name: str):
        return self.storage.info(name)

    def raw(self, name: str) -> np.ndarray:
        i = self.storage.info(name)
        arr = self._maps.get(i.path)
        if arr is None:
            with open(i.path, "rb") as f:
                arr = self._maps[i.path] = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
        return arr[i.begin:i.begin + i.nbytes]

    def raw2d(self, name: str) -> np.ndarray:
        i = self.storage.info(name)
        return self.raw(name).reshape(i.rows, -1)


class Job:
    """What every method is given: the checkpoint, this rank's plan and device."""

    def __init__(self, root: str, config: str, tp: int, rank: int, world: int, device: torch.device,
                 digest_store: str = "") -> None:
        self.root, self.config, self.tp, self.rank, self.world, self.device = root, config, tp, rank, world, device
        self.digest_store = digest_store or None
        self.ckpt = Mapped(root)
        self.planner = Planner(self.ckpt.catalogue, choose(config, Path(root).absolute())[0])
        self.layout = Layout(tp, world // tp)
        self.plan: RankPlan = self.planner.plan(self.layout, "packed", rank)
        self.bytes_hashed = 0
        self.note = ""

    def cuts(self) -> list[tuple[str, Cut]]:
        """(served name, cut) of every packed output, in plan order."""
        return [(o.name, c) for item in self.plan.items for o, c in zip(item.outputs, (item.weight, item.scale))]


def _served(cut: Cut, t: torch.Tensor) -> torch.Tensor:
    """A peer's window as tpload serves it: F16 becomes BF16 (tiny norms; the same rule as tpload)."""
    if cut.dtype == "F16":
        values = t.view(torch.float16)
        return torch.empty(values.shape, dtype=torch.bfloat16, device=t.device).copy_(values.to(torch.float32))
    return t


def run_floor(job: Job) -> Windows:
    """Only the copies: each window out of the map into its slot of an arena (tpload's allocator), no checks."""
    arena = new_arena(job.plan.arena_bytes) if job.device.type == "cpu" else \
        torch.empty(job.plan.arena_bytes, dtype=torch.uint8, device=job.device)
    out: Windows = {}
    for item in job.plan.items:
        for o, cut in zip(item.outputs, (item.weight, item.scale)):
            window = job.ckpt.raw2d(cut.name)[cut.rows[0]:cut.rows[1], cut.cols[0]:cut.cols[1]]
            slot = arena[o.offset:o.offset + o.nbytes]
            if cut.dtype == "F16":
                out[o.name] = _served(cut, torch.from_numpy(window).to(job.device).view(torch.float16).view(cut.shape))
            else:
                out[o.name] = slot.view(o.shape[0] if len(o.shape) > 1 else 1, -1).copy_(torch.from_numpy(window))
    return out


def _tpload(kind: str, verify: str) -> Callable[[Job], Windows]:
    def run(job: Job) -> Windows:
        shards = tpload.load(job.root, config=job.config, kind=kind, tp=job.tp, ep=job.world // job.tp,
                             device=str(job.device), verify=verify, progress=False, digest_store=job.digest_store)
        job.bytes_hashed = shards.report.mine.bytes_hashed
        job.shards = shards  # keep the arena alive until the digest is taken
        return shards.state_dict()
    return run


def _element_slices(cut: Cut) -> tuple[slice, ...]:
    """The cut (rows and row-byte range) as element slices for safetensors' get_slice."""
    item = ITEMSIZE[cut.dtype]
    if len(cut.shape) <= 1:
        return (slice(cut.cols[0] // item, cut.cols[1] // item),)
    return (slice(*cut.rows), slice(cut.cols[0] // item, cut.cols[1] // item))


def run_safetensors(job: Job) -> Windows:
    """vLLM-style: ``safe_open`` + ``get_slice`` of each window, copied into a parameter allocated on the
    device (``param.copy_(loaded)``); no verification. safetensors >= 0.6 hands back views of its map,
    so without that copy a CPU rank would own nothing."""
    from safetensors import safe_open
    handles, out = {}, {}
    try:
        for name, cut in job.cuts():
            info = job.ckpt.info(cut.name)
            f = handles.get(info.path)
            if f is None:
                f = handles[info.path] = safe_open(str(info.path), framework="pt", device="cpu").__enter__()
            t = f.get_slice(cut.name)[_element_slices(cut)]
            param = torch.empty(t.shape, dtype=t.dtype, device=job.device)
            out[name] = _served(cut, param.copy_(t))
    finally:
        for f in handles.values():
            f.__exit__(None, None, None)
    return out


def run_fastsafetensors(job: Job) -> Windows:
    """fastsafetensors: each rank reads whole files, then get_sharded/get_tensor scatter or broadcast windows.

    gloo has no float8 collectives: F8_E4M3 (like F8_E8M0, which the library
    already sends as bytes) is reinterpreted as uint8 on both sides.
    """
    from fastsafetensors import SafeTensorsFileLoader
    from fastsafetensors.frameworks import _torch as fst_torch
    from fastsafetensors.st_types import DType
    if dist.get_backend() == "gloo":
        plain = fst_torch._needs_uint8_view
        fst_torch._needs_uint8_view = lambda d: d in (DType.F8_E4M3, DType.F8_E5M2) or plain(d)
        job.note = "float8 sent as bytes on gloo"
    if job.world != job.tp:
        raise SystemExit("fastsafetensors: only a tp-only layout (tp = world) is comparable")
    files = sorted({str(job.ckpt.info(c.name).path) for _, c in job.cuts()})
    loader = SafeTensorsFileLoader(dist.group.WORLD, str(job.device), nogds=True, max_threads=max(1, torch.get_num_threads()))
    out: Windows = {}
    try:
        loader.add_filenames({r: files[r::job.world] for r in range(job.world)})
        buffers = loader.copy_files_to_device()
        for item in job.plan.items:
            split = _split_of(job, item)
            for o, cut in zip(item.outputs, (item.weight, item.scale)):
                t = buffers.get_tensor(cut.name) if split is None else buffers.get_sharded(cut.name, split)
                out[o.name] = _served(cut, t)
        buffers.close()
    finally:
        loader.close()
    return out


def _split_of(job: Job, item: Item) -> int | None:
    """The dimension this item is cut on (None: whole on every rank)."""
    full = job.ckpt.info(item.weight.name)
    if item.weight.shape == full.shape:
        return None
    return 0 if item.weight.shape[0] != full.shape[0] else 1


def run_seed(job: Job) -> Windows:
    """The seed loader's method: every rank sha256-hashes every tensor it uses in full, copies its
    window to the device, and compares the device copy byte for byte with the host slice."""
    manifest = job.ckpt.manifest
    out: Windows = {}
    for name, cut in job.cuts():
        raw = job.ckpt.raw(cut.name)
        if hashlib.sha256(memoryview(raw)).hexdigest() != manifest[cut.name].sha256:
            raise SystemExit(f"seed: {cut.name}: sha256 does not match the manifest")
        job.bytes_hashed += raw.nbytes
        window = job.ckpt.raw2d(cut.name)[cut.rows[0]:cut.rows[1], cut.cols[0]:cut.cols[1]]
        if cut.dtype in ("F8_E8M0",) and (((window == 255) | (window == 0)).any()):
            raise SystemExit(f"seed: {cut.name}: E8M0 scale bytes 0/255")
        host = np.ascontiguousarray(window)
        dev = torch.empty(host.shape, dtype=torch.uint8, device=job.device)
        dev.copy_(torch.from_numpy(host))
        if not np.array_equal(dev.cpu().numpy(), host):
            raise SystemExit(f"seed: {cut.name}: device bytes differ from the host slice")
        out[name] = _served(cut, dev)
    return out


METHODS: dict[str, Callable[[Job], Windows]] = {
    "floor": run_floor,
    "tpload": _tpload("packed", "node"),
    "tpload-rank": _tpload("packed", "rank"),
    "tpload-digest": _tpload("packed", "digest"),
    "tpload-noverify": _tpload("packed", "off"),
    "tpload-expanded": _tpload("expanded", "node"),
    "safetensors": run_safetensors,
    "fastsafetensors": run_fastsafetensors,
    "seed": run_seed,
}
"""Every method the bench knows, by name (fastsafetensors only when importable)."""


def window_digest(windows: Windows) -> str:
    """Digest of a rank's windows as bytes: ``name|uint8|rows x row_bytes|fingerprint`` lines (README, Digests)."""
    entries = []
    for name, t in windows.items():
        b = as_bytes2d(t.contiguous())
        fp = fingerprint(b)
        entries.append((name, torch.uint8, tuple(b.shape), tuple(fp.tolist()) if isinstance(fp, torch.Tensor) else fp))
    return digest(entries)


def _anon() -> int:
    m = psutil.Process().memory_info()
    return m.rss - getattr(m, "shared", 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload.bench_worker")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--digest-store", default="")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    t_import = time.perf_counter()
    import tpload.api  # noqa: F401  (`import tpload` is lazy: the loader and its kernels load here, untimed)
    import_seconds = time.perf_counter() - t_import
    dist.barrier()
    anon_before = _anon()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with MemoryPeaks() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        job = Job(args.checkpoint, args.config, args.tp, rank, world, device, args.digest_store)
        windows = METHODS[args.method](job)
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    result = {
        "method": args.method, "rank": rank, "world": world, "seconds": seconds, "import_seconds": import_seconds,
        "cpu_seconds": cpu_seconds,
        "window_bytes": sum(t.numel() * t.element_size() for t in windows.values()),
        "largest_window": max((t.numel() * t.element_size() for t in windows.values()), default=0),
        "bytes_hashed": job.bytes_hashed, "rss_peak": mem.rss_peak, "anon_peak": mem.anon_peak,
        "anon_before": anon_before, "device_peak": torch.cuda.max_memory_allocated(device) if cuda else 0,
        "tensors": len(windows), "digest": window_digest(windows), "note": job.note,
    }
    Path(args.out, f"{args.method}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

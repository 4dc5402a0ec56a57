"""One bench run of one method on one rank, started by ``tpload bench`` under torchrun.

    torchrun --nproc-per-node N -m tpload.tools.bench_worker METHOD CHECKPOINT OUT_DIR --tp T
        [--config C]

Every method does the same job: this rank ends up owning its window of every
tensor (the windows :class:`tpload.planning.planner.Planner` cuts) on its device. The
clock runs from after process-group init (and a barrier) to a final barrier;
the window digest is taken after the clock stops, so checking that every
method served the same bytes costs no method anything.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import torch
import torch.distributed as dist

import tpload

from ..codecs.base import Cut

# The bench's own pieces that every method shares (the plan of the windows, the map); none of these
# imports tpload's kernels (numba), so a method's own imports are timed in a process without them.
from ..model.meta import ITEMSIZE
from ..planning.items import Item, Output
from ..selection.defaults import DEFAULT_CONFIG
from ..storage.files import atomic_write
from .bench_job import Job, Windows, blake3_store


def _served(cut: Cut, t: torch.Tensor) -> torch.Tensor:
    """A peer's window as tpload serves it: F16 becomes BF16 (tiny norms; the same rule as
    tpload)."""
    if cut.dtype == "F16":
        values = t.view(torch.float16)
        return torch.empty(values.shape, dtype=torch.bfloat16, device=t.device).copy_(
            values.to(torch.float32)
        )
    return t


def run_floor(job: Job) -> Windows:
    """Only the copies: each window out of the map into its slot of an arena (tpload's allocator),
    no checks."""
    from ..transfer.cpu import new_arena

    arena = (
        new_arena(job.plan.arena_bytes)[0]
        if job.device.type == "cpu"
        else torch.empty(job.plan.arena_bytes, dtype=torch.uint8, device=job.device)
    )
    out: Windows = {}
    for o, cut in job.outputs():
        out[o.name] = _place(
            o, cut, torch.from_numpy(job.ckpt.window(cut)), arena[o.offset : o.offset + o.nbytes]
        )
    return out


def _place(o: Output, cut: Cut, window: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Copy a window (2-D bytes, as the cut's view has them: a stacked tensor's rows are experts x
    rows) into ``dst`` (flat bytes on the device) and serve it as every method does."""
    dst.view(window.shape[0], -1).copy_(window)
    if cut.dtype == "F16":
        return _served(cut, dst.view(torch.float16).view(cut.shape))
    return _rows(o, dst)


def _rows(o: Output, flat: torch.Tensor) -> torch.Tensor:
    """An output's bytes as the floor serves them: ``[first dimension, the rest]`` (a 0-D or 1-D
    one: one row)."""
    return flat.view(o.shape[0] if len(o.shape) > 1 else 1, -1)


def _window_of(whole: torch.Tensor, cut: Cut) -> torch.Tensor:
    """The cut's box of a whole stored tensor (any dtype, any device), as 2-D bytes (a view)."""
    return (
        whole.reshape(-1)
        .view(torch.uint8)
        .view(cut.view)[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]
    )


def _own_window(job: Job, o: Output, cut: Cut, whole: torch.Tensor) -> torch.Tensor:
    """This rank's window of a whole tensor a peer handed over, copied into memory of its own on its
    device."""
    return _place(
        o,
        cut,
        _window_of(whole, cut),
        torch.empty(cut.nbytes, dtype=torch.uint8, device=job.device),
    )


def _tpload(
    kind: Literal["packed", "expanded"],
    verify: Literal["node", "rank", "digest", "off"],
    *,
    blake3: bool = False,
) -> Callable[[Job], Windows]:
    """A tpload load; ``blake3``: from the store that holds the bench's blake3 sidecar
    (bench.prepare_blake3), refused unless the load really hashed by blake3."""

    def run(job: Job) -> Windows:
        store = (
            str(blake3_store(job.digest_store)) if blake3 and job.digest_store else job.digest_store
        )
        shards = tpload.load(
            job.root,
            config=job.config,
            kind=kind,
            tp=job.tp,
            ep=job.world // job.tp,
            device=str(job.device),
            verify=verify,
            progress=False,
            digest_store=store,
        )
        if blake3 and shards.report.hash != "blake3":
            raise SystemExit(
                f"tpload-blake3: the load hashed by {shards.report.hash} "
                f"({'; '.join(shards.report.notes)})"
            )
        job.bytes_hashed = shards.report.mine.bytes_hashed
        job.shards = shards  # keep the arena alive until the digest is taken
        return shards.state_dict()

    return run


def _element_slices(shape: tuple[int, ...], cut: Cut) -> tuple[slice, ...]:
    """The cut as one element slice per dimension of the stored tensor (``shape``), for safetensors'
    get_slice: the view's rows are the leading dimensions flattened, its row bytes the trailing
    ones."""
    k = next(k for k in range(len(shape) + 1) if math.prod(shape[:k]) == cut.view[0])
    item = ITEMSIZE[cut.dtype]
    return _flat_slices(shape[:k], *cut.rows) + _flat_slices(
        shape[k:], cut.cols[0] // item, cut.cols[1] // item
    )


def _flat_slices(dims: tuple[int, ...], a: int, b: int) -> tuple[slice, ...]:
    """Range ``[a, b)`` of the row-major flattening of ``dims`` as one slice per dimension (a box:
    whole in every dimension inside the one it cuts)."""
    if not dims:
        return ()
    inner = math.prod(dims[1:])
    if a % inner == 0 and b % inner == 0:
        return (slice(a // inner, b // inner),) + (slice(None),) * (len(dims) - 1)
    i = a // inner
    if (b - 1) // inner != i:
        raise SystemExit(f"safetensors: elements [{a}, {b}) of {dims} are not a box")
    return (slice(i, i + 1),) + _flat_slices(dims[1:], a - i * inner, b - i * inner)


def run_safetensors(job: Job) -> Windows:
    """vLLM-style: ``safe_open`` + ``get_slice`` of each window, copied into a parameter allocated
    on the device (``param.copy_(loaded)``); no verification. safetensors >= 0.6 hands back views of
    its map, so without that copy a CPU rank would own nothing."""
    from safetensors import safe_open

    handles: dict[Path, Any] = {}  # safetensors' open files
    out: Windows = {}
    try:
        for name, cut in job.cuts():
            info = job.ckpt.info(cut.name)
            f = handles.get(info.path)
            if f is None:
                f = handles[info.path] = safe_open(
                    str(info.path), framework="pt", device="cpu"
                ).__enter__()  # type: ignore[no-untyped-call]  # safetensors' stub leaves it bare
            # a scalar (NVFP4's global scale) has no slices: it is whole on every rank
            t = (
                f.get_slice(cut.name)[_element_slices(info.shape, cut)]
                if cut.shape
                else f.get_tensor(cut.name)
            )
            param = torch.empty(t.shape, dtype=t.dtype, device=job.device)
            out[name] = _served(cut, param.copy_(t))
    finally:
        for f in handles.values():
            f.__exit__(None, None, None)
    return out


def run_fastsafetensors(job: Job) -> Windows:
    """fastsafetensors: each rank reads whole files, then get_sharded/get_tensor scatter or
    broadcast windows.

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
    loader = SafeTensorsFileLoader(
        dist.group.WORLD, str(job.device), nogds=True, max_threads=max(1, torch.get_num_threads())
    )
    out: Windows = {}
    job.reads, job.bytes_read = (
        "whole files",
        sum(os.path.getsize(f) for f in files[job.rank :: job.world]),
    )
    try:
        loader.add_filenames({r: files[r :: job.world] for r in range(job.world)})
        buffers = loader.copy_files_to_device()
        for item in job.plan.items:
            split = _split_of(job, item)
            cuts = [c for c in (item.weight, item.scale) if c is not None]
            for o, cut in zip(item.outputs, cuts, strict=False):
                t = (
                    buffers.get_tensor(cut.name)
                    if split is None
                    else buffers.get_sharded(cut.name, split)
                )
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


def run_runai(job: Job) -> Windows:
    """Run:ai Model Streamer: it reads whole tensors (it has no windows) through its own threads
    into CPU buffers it reuses; each rank asks for the tensors it has a window of
    (``tensor_names``), then copies its window of each into memory of its own on its device. Not
    distributed (the library distributes only over NCCL): every rank reads its tensors in full."""
    from runai_model_streamer import SafetensorsStreamer

    wanted = job.by_tensor()
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(
            _files(job, wanted), device="cpu", tensor_names=list(wanted), owned=False
        )
        out = _windows_of_whole(job, wanted, streamer.get_tensors())
        job.bytes_read = streamer.total_size
    return out


def run_instanttensor(job: Job) -> Windows:
    """InstantTensor (CUDA only): like runai, whole tensors, each rank its own (``tensor_filter``
    needs no process group, so its NCCL-coordinated mode, which gives every rank every tensor, is
    not used); buffered reads (the page cache, as every other method here) unless
    INSTANTTENSOR_BACKEND says."""
    from instanttensor import BackendPolicy, safe_open

    if job.device.type != "cuda":
        raise SystemExit("instanttensor: CUDA devices only")
    wanted = job.by_tensor()
    backend = None if os.environ.get("INSTANTTENSOR_BACKEND") else BackendPolicy.BUFFERED
    with safe_open(
        _files(job, wanted),
        framework="pt",
        device=job.device,
        copy=False,
        backend=backend,
        tensor_filter=list(wanted),
        tensor_name_match_mode="exact",
    ) as f:
        out = _windows_of_whole(job, wanted, f.tensors())
        job.bytes_read = f.total_tensor_size
    return out


def _files(job: Job, names: Iterable[str]) -> list[str]:
    return sorted({str(job.ckpt.info(name).path) for name in names})


def _windows_of_whole(
    job: Job,
    wanted: dict[str, list[tuple[Output, Cut]]],
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> Windows:
    """This rank's windows of the whole tensors a peer hands over (views into buffers it reuses:
    each window is copied out before the next tensor comes)."""
    out: Windows = {}
    for name, whole in tensors:
        for o, cut in wanted[name]:
            out[o.name] = _own_window(job, o, cut, whole)
    job.reads = "whole tensors"
    return out


def run_seed(job: Job) -> Windows:
    """The seed loader's method: every rank sha256-hashes every tensor it uses in full, copies its
    window to the device, and compares the device copy byte for byte with the host slice."""
    manifest = job.ckpt.manifest
    if manifest is None:  # (the seed hashes against one)
        raise SystemExit("seed: the checkpoint has no manifest to hash against")
    out: Windows = {}
    for o, cut in job.outputs():
        raw = job.ckpt.raw(cut.name)
        if hashlib.sha256(raw.data).hexdigest() != manifest[cut.name].sha256:
            raise SystemExit(f"seed: {cut.name}: sha256 does not match the manifest")
        job.bytes_hashed += raw.nbytes
        window = job.ckpt.window(cut)
        if cut.dtype in ("F8_E8M0",) and (((window == 255) | (window == 0)).any()):
            raise SystemExit(f"seed: {cut.name}: E8M0 scale bytes 0/255")
        host = np.ascontiguousarray(window)
        dev = torch.empty(host.shape, dtype=torch.uint8, device=job.device)
        dev.copy_(torch.from_numpy(host))
        if not np.array_equal(dev.cpu().numpy(), host):
            raise SystemExit(f"seed: {cut.name}: device bytes differ from the host slice")
        out[o.name] = _served(cut, dev) if cut.dtype == "F16" else _rows(o, dev.view(-1))
    return out


METHODS: dict[str, Callable[[Job], Windows]] = {
    "floor": run_floor,
    "tpload": _tpload("packed", "node"),
    "tpload-rank": _tpload("packed", "rank"),
    "tpload-digest": _tpload("packed", "digest"),
    "tpload-noverify": _tpload("packed", "off"),
    "tpload-blake3": _tpload("packed", "node", blake3=True),
    "tpload-expanded": _tpload("expanded", "node"),
    "safetensors": run_safetensors,
    "fastsafetensors": run_fastsafetensors,
    "runai": run_runai,
    "instanttensor": run_instanttensor,
    "seed": run_seed,
}
"""Every method the bench knows, by name (the peers' packages only when importable)."""

IMPORTS: dict[str, tuple[str, ...]] = {
    "floor": (
        "tpload.transfer.cpu",
        "tpload.kernels.compiled",
    ),  # tpload's arena allocator, its kernels
    "safetensors": ("safetensors",),
    "fastsafetensors": ("fastsafetensors",),
    "runai": ("runai_model_streamer",),
    "instanttensor": ("instanttensor",),
    "seed": (),
}
"""What each method imports of its own, timed once per process before its clock; a ``tpload*``
method imports the loader and its kernels (``load()`` would otherwise load them on a thread
inside its own clock: once per process, not per load)."""


def import_method(method: str) -> float:
    """Seconds to import ``method``'s own modules (in a process that has torch and the plan
    already)."""
    t0 = time.perf_counter()
    loader = ("tpload.api", "tpload.kernels.compiled") if method.startswith("tpload") else ()
    for module in IMPORTS.get(method, loader):
        importlib.import_module(module)
    return time.perf_counter() - t0


def window_digest(windows: Windows) -> str:
    """Digest of a rank's windows as bytes: ``name|uint8|rows x row_bytes|fingerprint`` lines
    (README, Digests)."""
    from ..kernels.fingerprint import as_bytes2d, fingerprint
    from ..verification.digest import digest

    entries = []
    for name, t in windows.items():
        b = as_bytes2d(t.contiguous())
        fp = fingerprint(b)
        entries.append(
            (
                name,
                torch.uint8,
                tuple(b.shape),
                tuple(fp.tolist()) if isinstance(fp, torch.Tensor) else fp,
            )
        )
    return digest(entries)


def storage_read_bytes() -> int | None:
    """The bytes this process (all its threads, hash workers included) caused to be fetched from
    storage so far: the kernel's ``read_bytes`` (``/proc/self/io``, through psutil): its reads,
    page faults and readahead that missed the page cache, not a page another process brought in
    first. None where the kernel does not say (not Linux, no task I/O accounting)."""
    try:
        return int(psutil.Process().io_counters().read_bytes)
    except (AttributeError, OSError, psutil.Error):
        return None


def _anon() -> int:
    m = psutil.Process().memory_info()
    anon: int = m.rss - getattr(m, "shared", 0)
    return anon


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload.tools.bench_worker")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--digest-store", default="")
    args = p.parse_args(argv)
    # Process start to here: python, torch and the bench's plan (every method alike); then the
    # method's own.
    startup_seconds = time.time() - psutil.Process().create_time()
    import_seconds = import_method(args.method)
    # the harness's (it pulls in tpload's kernels): after the timed import
    from ..report.memory import MemoryPeaks

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = (
        torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    anon_before = _anon()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    io_before = storage_read_bytes()
    with MemoryPeaks() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        job = Job(args.checkpoint, args.config, args.tp, rank, world, device, args.digest_store)
        windows = METHODS[args.method](job)
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    io_after = storage_read_bytes()
    result = {
        "method": args.method,
        "rank": rank,
        "world": world,
        "seconds": seconds,
        "import_seconds": import_seconds,
        "startup_seconds": startup_seconds,
        "cpu_seconds": cpu_seconds,
        "reads": job.reads,
        "window_bytes": sum(t.numel() * t.element_size() for t in windows.values()),
        "largest_window": max((t.numel() * t.element_size() for t in windows.values()), default=0),
        "bytes_read": job.bytes_read
        if job.bytes_read is not None
        else sum(c.nbytes for _, c in job.cuts()),
        "bytes_hashed": job.bytes_hashed,
        # from storage, by the kernel's count (None: it does not count)
        "storage_read_bytes": io_after - io_before
        if io_before is not None and io_after is not None
        else None,
        "rss_peak": mem.rss_peak,
        "anon_peak": mem.anon_peak,
        "anon_before": anon_before,
        "device_peak": torch.cuda.max_memory_allocated(device) if cuda else 0,
        "tensors": len(windows),
        "digest": window_digest(windows),
        "note": job.note,
    }
    atomic_write(Path(args.out, f"{args.method}-rank{rank}.json"), json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

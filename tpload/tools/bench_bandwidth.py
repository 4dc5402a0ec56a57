"""What the machine can do, beside the bench's table: each decoded format's decode against a copy of
the same size (on the CPU, or on a GPU against a device copy: the HBM figure), and each GPU's
pinned host-to-device bandwidth (the PCIe figure) a rank's load rate is judged against."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..codecs.base import Cut, decode_rows
from ..loading.pick import choose
from ..loading.planner import planner_of
from ..model.values import Layout
from ..planning.items import Item
from ..selection.defaults import DEFAULT_CONFIG
from ..storage.sharded import ShardedStorage

if TYPE_CHECKING:
    import numpy as np

MIB = 1 << 20


def decode_bandwidth(
    ckpt_dir: str, *, threads: int, reps: int = 5, config: str = DEFAULT_CONFIG, device: str = "cpu"
) -> dict[str, Any]:
    """Each decoded format's decode to bf16 on the CPU (bf16 bytes out per second) against a copy of
    the same output size, on the format's biggest tensor in the plan: picked by the codec the plan
    gave it, never by name, so any layout (the reference one, a published family's) has its formats
    measured. Every buffer is touched first, so page faults count for neither. The decodes go the
    way a CPU load's do (the codec's own path, row blocks unfolded for stacked tensors): the
    compiled kernels (single-threaded whatever ``threads`` is; it sets torch's count). On a GPU
    (``device``), the device decode against a device-to-device copy of the output: the HBM figure of
    that device."""
    storage = ShardedStorage(Path(ckpt_dir).absolute())
    try:
        plan = planner_of(storage.catalogue, choose(config, storage.root)[0]).plan(
            Layout(1), "expanded", 0
        )
        torch.set_num_threads(threads)
        codecs = {
            label: _measure_decode(storage, item, reps, torch.device(device))
            for label, item in biggest_decodes(plan.items).items()
        }
    finally:
        storage.close()
    return {"threads": threads, "device": device, "codecs": codecs}


def decode_label(item: Item) -> str:
    """A decoded format: its codec and stored dtypes (weight/scales; the kernels differ by scale
    dtype)."""
    return f"{item.codec.name} {'/'.join(c.dtype for c in (item.weight, *item.scales))}"


def biggest_decodes(items: Sequence[Item]) -> dict[str, Item]:
    """Each decoded format's biggest item (by decoded bytes) in a plan of the expanded kind, by
    label."""
    out: dict[str, Item] = {}
    for item in items:
        if item.codec.copies(item.fit, "expanded"):
            continue  # served as stored: nothing to decode
        label = decode_label(item)
        if label not in out or item.outputs[0].nbytes > out[label].outputs[0].nbytes:
            out[label] = item
    return out


def _measure_decode(
    storage: ShardedStorage, item: Item, reps: int, device: torch.device
) -> dict[str, Any]:
    codec, fit = item.codec, item.fit
    weight, *scales = (_on(_read(storage, cut), device) for cut in (item.weight, *item.scales))
    scale, scale2 = (scales + [None, None])[:2]
    out = torch.zeros(item.outputs[0].shape, dtype=torch.bfloat16, device=device)
    rows = out.reshape(item.weight.rows[1] - item.weight.rows[0], -1)
    unfold = item.weight.row_bytes // codec.decode_row_bytes(
        fit, item.weight
    )  # decode rows per view row
    seconds = _best(
        lambda: decode_rows(codec.decode, fit, unfold, weight, scale, rows, scale2), reps, device
    )
    copy = torch.zeros_like(out)
    memcpy = _best(lambda: copy.copy_(out), reps, device)
    nbytes = out.numel() * out.element_size()
    return {
        "tensor": item.name,
        "bytes_out": nbytes,
        "gb_per_s": nbytes / seconds / 1e9,
        "memcpy_gb_per_s": nbytes / memcpy / 1e9,
        "vs_memcpy": memcpy / seconds,
    }


def _read(storage: ShardedStorage, cut: Cut) -> np.ndarray:
    """A cut's box of its stored tensor, as host bytes in the cut's 2-D view."""
    import numpy as np

    stored = storage.stored(cut.name)
    buf: np.ndarray = np.empty((stored.rows, stored.row_bytes), dtype=np.uint8)
    storage.read(stored, 0, stored.rows, buf)
    return buf.reshape(cut.view)[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]


def _on(host: np.ndarray, device: torch.device) -> np.ndarray | torch.Tensor:
    """Host bytes where the decode runs: as they are on the CPU, a device tensor on a GPU."""
    if device.type == "cpu":
        return host
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(host)).to(device)


def _best(fn: Callable[[], object], reps: int, device: torch.device | None = None) -> float:
    device = device or torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def h2d_bandwidth(device: torch.device, *, nbytes: int = 256 * MIB, reps: int = 5) -> float:
    """GB/s of one pinned host buffer copied to ``device``: this machine's host-to-device (PCIe)
    figure, which a rank's load rate is judged against."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return nbytes / _best(lambda: dev.copy_(host, non_blocking=True), reps, device) / 1e9


def decode_lines(d: dict[str, Any]) -> list[str]:
    """One line per decoded format (none: the checkpoint is served as stored)."""
    where = "on CPU" if d.get("device", "cpu") == "cpu" else f"on {d['device']}"
    if not d["codecs"]:
        return [f"decode {where}: nothing to decode (every tensor is served as stored)"]
    threads = f" ({d['threads']} thread(s))" if where == "on CPU" else ""
    copy = "memcpy" if where == "on CPU" else "device copy (HBM)"
    return [
        f"decode {where}{threads}, {label}: {c['gb_per_s']:.2f} GB/s bf16 out, "
        f"{c['vs_memcpy'] * 100:.0f}% of a {copy} of the same {c['bytes_out'] / MIB:.1f} MiB "
        f"({c['memcpy_gb_per_s']:.2f} GB/s); biggest such tensor: {c['tensor']}"
        for label, c in d["codecs"].items()
    ]


def gpu_figures(
    ckpt: str, config: str, summaries: list[dict[str, Any]], *, decode: bool
) -> dict[str, Any]:
    """On a GPU machine: each GPU's pinned host-to-device GB/s (the PCIe figure) beside each
    method's per-rank load rate, and the device decode against a device copy (the HBM figure)."""
    h2d = [h2d_bandwidth(torch.device("cuda", k)) for k in range(torch.cuda.device_count())]
    pcie = min(h2d)
    print(f"host-to-device, pinned, per GPU: {', '.join(f'{g:.1f}' for g in h2d)} GB/s", flush=True)
    for s in summaries:
        rate = s.get("gb_per_s_per_rank")
        if rate:
            print(
                f"  {s['method']}: {rate:.2f} GB/s per rank = {rate / pcie * 100:.0f}% of the "
                "slowest GPU's host-to-device",
                flush=True,
            )
    out: dict[str, Any] = {"h2d_gb_per_s": h2d}
    if decode:
        out["decode"] = decode_bandwidth(ckpt, threads=1, config=config, device="cuda:0")
        print("\n".join(decode_lines(out["decode"])), flush=True)
    return out

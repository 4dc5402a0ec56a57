"""Run one rank's plan: host window -> device -> (decode) -> its slot in the arena.

The loop does no device-to-host syncs: each served tensor's checks (its
fingerprint, its count of bad codes) stay on the device as a small int64
tensor until :func:`run` collects them all with one transfer at the end.
sha256 runs alongside on worker threads (hashlib releases the GIL).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from . import formats
from .checkpoint import Checkpoint
from .errors import LoadError
from .pagecache import ShardRelease
from .plan import Cut, Item, Output, RankPlan
from .report import Progress
from .verify import as_bytes2d, digest, fingerprint, host_fingerprint


@dataclass
class LoadResult:
    """What one rank holds after :func:`run`: the arena, its views and the evidence."""

    arena: torch.Tensor
    tensors: dict[str, torch.Tensor]
    fingerprints: dict[str, tuple[int, int, int]]
    hashed: list[str] = field(default_factory=list)
    bytes_hashed: int = 0
    device_checked: int = 0
    sampled: int = 0

    def digest(self) -> str:
        """This rank's digest of what it serves (README, "Digests")."""
        return digest((n, t.dtype, tuple(t.shape), self.fingerprints[n]) for n, t in self.tensors.items())


@dataclass
class _Check:
    """One served tensor's pending evidence (device tensors until the final sync)."""

    output: Output
    item: Item
    device_fp: torch.Tensor
    bad: list[tuple[torch.Tensor, str]] = field(default_factory=list)
    """(count, what) of invalid values: bad scale bytes, NaN codes, non-finite decodes."""
    want_fp: tuple[int, int, int] | None = None
    """Fingerprint the device tensor must have (host window, or an exact host decode)."""
    want_what: str = ""


class Stager:
    """Moves host windows to the device.

    CPU: a zero-copy view of the map (or one copy straight into the slot).
    CUDA: the window is gathered into one of two pinned buffers and sent with
    a non-blocking copy on a side stream; an event guards each buffer's reuse,
    so gathering the next window overlaps the previous copy and decode.
    """

    def __init__(self, device: torch.device, max_bytes: int) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            n = max(max_bytes, 1)
            self.pinned = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self.staging = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(2)]
            self.events = [torch.cuda.Event() for _ in range(2)]
            self.stream = torch.cuda.Stream(device)
            self.turn = 0

    def put(self, window: np.ndarray, dst: torch.Tensor | None = None) -> torch.Tensor:
        """``window`` (a 2-D host byte view) on the device, in ``dst`` if given."""
        if not self.cuda:
            src = torch.from_numpy(window)
            return src if dst is None else dst.copy_(src)
        i = self.turn = 1 - self.turn
        self.events[i].synchronize()  # the copy that last read this pinned buffer is done
        n = window.size
        host = self.pinned[i][:n].view(window.shape)
        np.copyto(host.numpy(), window)
        target = dst if dst is not None else self.staging[i][:n].view(window.shape)
        with torch.cuda.stream(self.stream):
            target.copy_(host, non_blocking=True)
            self.events[i].record(self.stream)
        return target

    def __enter__(self) -> Stager:
        if self.cuda:
            self._ctx = torch.cuda.stream(self.stream)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self._ctx.__exit__(*exc)
            self.stream.synchronize()


def _window(ckpt: Checkpoint, cut: Cut) -> np.ndarray:
    return ckpt.window(cut.name, cut.rows, cut.cols)


def _slot(arena: torch.Tensor, out: Output) -> torch.Tensor:
    return arena[out.offset:out.offset + out.nbytes].view(out.dtype).view(out.shape)


def _is_sampled(index: int, count: int, per_role: int) -> bool:
    """Spread ``per_role`` samples evenly over ``count`` items (first and last included)."""
    if per_role <= 0 or count == 0:
        return False
    picks = {round(j * (count - 1) / max(per_role - 1, 1)) for j in range(min(per_role, count))}
    return index in picks


def _bad_scale(scale: torch.Tensor, dtype: str) -> tuple[torch.Tensor, str]:
    if dtype == "F32":
        f = scale.view(torch.float32)
        return formats.not_finite(f) + (f.amin() <= 0).to(torch.int64), "F32 scale windows with a value not finite and positive"
    return formats.count_bad_e8m0(scale), "E8M0 scale bytes 0x00/0xFF (expected 1..254: the serving kernels assume it)"


def _bad_e4m3(weight: torch.Tensor) -> tuple[torch.Tensor, str]:
    return formats.count_bad_e4m3(weight), "E4M3 NaN codes 0x7F/0xFF"


def _not_finite(t: torch.Tensor, what: str) -> tuple[torch.Tensor, str]:
    return formats.not_finite(t), what


def _host_decode(item: Item, w: np.ndarray, s: np.ndarray) -> tuple[int, int, int]:
    """Fingerprint of the reference decode of this window, made on the host CPU."""
    out = torch.empty(item.outputs[0].shape, dtype=torch.bfloat16)
    _decode(item, torch.from_numpy(w), torch.from_numpy(s), out)
    return tuple(fingerprint(as_bytes2d(out)).tolist())


def _decode(item: Item, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    if item.role == "fp4":
        formats.decode_fp4(w, s, out)
    else:
        scale = s.view(torch.float32) if item.scale.dtype == "F32" else s.view(torch.uint8).reshape(item.scale.shape)
        formats.decode_fp8(w.view(torch.uint8).reshape(item.weight.shape), scale, out, block=item.block)


def _load_item(ckpt: Checkpoint, item: Item, arena: torch.Tensor, stager: Stager, sample: bool) -> list[_Check]:
    w_np = _window(ckpt, item.weight)
    if item.role == "plain":
        out = item.outputs[0]
        slot = _slot(arena, out)
        if item.weight.dtype == "F16":  # served as BF16: convert on the device, check finiteness
            src = stager.put(w_np).view(torch.float16)
            formats.f16_to_bf16(src, slot.view(src.shape))
            return [_Check(out, item, fingerprint(as_bytes2d(slot)), [_not_finite(slot, "conversion(s) not finite everywhere after F16 -> BF16")])]
        stager.put(w_np, as_bytes2d(slot))
        return [_Check(out, item, fingerprint(as_bytes2d(slot)), want_fp=host_fingerprint(w_np), want_what="host window")]
    s_np = _window(ckpt, item.scale)
    if len(item.outputs) == 2:  # packed: the stored bytes of both, as they are
        wo, so = item.outputs
        w_slot, s_slot = _slot(arena, wo), _slot(arena, so)
        stager.put(w_np, as_bytes2d(w_slot))
        stager.put(s_np, as_bytes2d(s_slot))
        w_bad = [_bad_e4m3(w_slot)] if item.role == "fp8" else []
        return [_Check(wo, item, fingerprint(as_bytes2d(w_slot)), w_bad, host_fingerprint(w_np), "host window"),
                _Check(so, item, fingerprint(as_bytes2d(s_slot)), [_bad_scale(s_slot, item.scale.dtype)],
                       host_fingerprint(s_np), "host window")]
    out = item.outputs[0]
    slot = _slot(arena, out)
    w_dev, s_dev = stager.put(w_np), stager.put(s_np)
    bad = [_bad_scale(s_dev, item.scale.dtype)] + ([_bad_e4m3(w_dev)] if item.role == "fp8" else [])
    _decode(item, w_dev, s_dev, slot)
    bad.append(_not_finite(slot, "decode(s) not finite everywhere (it overflows bf16, or decodes a bad code)"))
    check = _Check(out, item, fingerprint(as_bytes2d(slot)), bad)
    if sample:
        check.want_fp, check.want_what = _host_decode(item, w_np, s_np), "exact host decode"
    return [check]


def _hash_all(ckpt: Checkpoint, names: list[str], threads: int) -> tuple[ThreadPoolExecutor, list[tuple[str, Future]]]:
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tpload-sha")
    return pool, [(n, pool.submit(ckpt.sha256, n)) for n in names]


def run(ckpt: Checkpoint, plan: RankPlan, *, device: torch.device, to_hash: list[str], hash_threads: int,
        samples_per_role: int, progress: Progress, evict: bool = False) -> LoadResult:
    """Load ``plan`` onto ``device``, hashing ``to_hash`` alongside; raise LoadError listing every problem.

    ``evict``: drop each shard's map and page cache once this rank is done with it (pagecache.py).
    """
    arena = torch.empty(plan.arena_bytes, dtype=torch.uint8, device=device)
    pool, hashes = _hash_all(ckpt, to_hash, hash_threads)
    shard_release = ShardRelease(ckpt, plan.items, hashes) if evict else None
    checks: list[_Check] = []
    role_counts = {r: sum(1 for i in plan.items if i.role == r) for r in ("fp4", "fp8")}
    seen = {"fp4": 0, "fp8": 0}
    max_window = max((max(i.weight.nbytes, i.scale.nbytes if i.scale else 0) for i in plan.items), default=0)
    try:
        with Stager(device, max_window) as stager:
            for item in plan.items:
                sample = False
                if item.role in seen and plan.kind == "expanded":
                    sample = _is_sampled(seen[item.role], role_counts[item.role], samples_per_role)
                    seen[item.role] += 1
                checks += _load_item(ckpt, item, arena, stager, sample)
                if shard_release is not None:
                    shard_release.item_done(item)
                progress.update(item.read_bytes)
        result = _settle(ckpt, plan, arena, checks, hashes)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        progress.close()
    return result


def _settle(ckpt: Checkpoint, plan: RankPlan, arena: torch.Tensor, checks: list[_Check],
            hashes: list[tuple[str, Future]]) -> LoadResult:
    """Collect device evidence in one transfer and sha256 results; list every problem."""
    problems: list[str] = []
    fps = torch.stack([c.device_fp for c in checks]).tolist() if checks else []
    counts = [n for c in checks for n, _ in c.bad]
    counts = iter(torch.stack(counts).tolist() if counts else [])
    result = LoadResult(arena, {}, {})
    for c, fp in zip(checks, fps):
        where = f"tensor {c.output.name} ({ckpt.info(c.item.name).file})"
        for (_, what), n in zip(c.bad, counts):
            if n:
                problems.append(f"{where}: {n} {what} in this rank's window")
        if c.want_fp is not None:
            if tuple(fp) != c.want_fp:
                problems.append(f"{where}: device bytes differ from the {c.want_what} (fingerprint {fp} != {list(c.want_fp)})")
            elif c.want_what == "exact host decode":
                result.sampled += 1
            else:
                result.device_checked += 1
        result.tensors[c.output.name] = _slot(arena, c.output)
        result.fingerprints[c.output.name] = tuple(fp)
    for name, fut in hashes:
        info, got = ckpt.info(name), fut.result()
        want = ckpt.manifest[name].sha256
        result.bytes_hashed += info.nbytes
        result.hashed.append(name)
        if got != want:
            problems.append(f"{info.path}: tensor {name}: sha256 {got[:16]}... does not match the manifest's {want[:16]}...")
    if problems:
        raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
    return result

"""Run one rank's plan: host window -> device -> (decode) -> its slot in the arena.

The loop does no device-to-host syncs: each served tensor's checks (its
fingerprint, its count of bad codes) stay on the device as a small int64
tensor until :func:`run` collects them all with one transfer at the end.
On the CPU a packed window's copy and its fingerprint are one compiled pass
(kernels.py). When the rank has no spare core and hashes the tensor itself,
the tensor is streamed in cache-sized row blocks: a block is hashed, then its
window rows are copied while still in the cache, so every byte is read from
memory once; with a spare core, sha256 runs on worker threads beside the
copies. On CUDA, sha256 always runs on worker threads (hashlib releases the
GIL) while the main thread stages windows through pinned buffers.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import formats, kernels
from .checkpoint import Checkpoint, sha256_mismatch
from .errors import LoadError
from .pagecache import ShardRelease
from .plan import Cut, Item, Output, RankPlan
from .report import ProgressSink
from .verify import HOST_BLOCK_BYTES, as_bytes2d, digest, fingerprint, host_fingerprint

PINNED_CHUNK_BYTES = 64 << 20  # CUDA: each of the two pinned staging buffers; larger windows go in row chunks
READAHEAD_ITEMS = 2  # CPU: how many items ahead the kernel is asked to read (cold page cache)
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not in the mmap module of Python 3.11


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
    device_fp: torch.Tensor | tuple[int, int, int]
    """The served tensor's fingerprint: a device tensor until settled (CPU: already a tuple)."""
    bad: list[tuple[torch.Tensor | int, str]] = field(default_factory=list)
    """(count, what) of invalid values: bad scale bytes, NaN codes, non-finite decodes."""
    want_fp: tuple[int, int, int] | torch.Tensor | None = None
    """Fingerprint the device tensor must have (host window, or an exact host decode); a CPU tensor until settled."""
    want_what: str = ""


class Stager:
    """Moves host windows to the device.

    CPU: a zero-copy view of the map (or one copy straight into the slot).
    CUDA: the window is gathered, in row chunks of at most
    ``PINNED_CHUNK_BYTES``, into one of two pinned buffers and sent with a
    non-blocking copy on a side stream; an event recorded after each copy
    guards that buffer's reuse, so gathering the next chunk overlaps the
    previous copy. Everything inside ``with stager:`` (decodes, fingerprints)
    runs on the same side stream, so stream order alone makes a staged window
    safe to read; device temporaries come from the caching allocator on that
    stream and are reused only after the work queued before them.
    """

    def __init__(self, device: torch.device, max_bytes: int) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            n = max(1, min(max_bytes, PINNED_CHUNK_BYTES))
            self.pinned = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self.events = [torch.cuda.Event() for _ in range(2)]
            self.stream = torch.cuda.Stream(device)
            self.turn = 0

    def put(self, window: np.ndarray, dst: torch.Tensor | None = None) -> torch.Tensor:
        """``window`` (a 2-D host byte view) on the device, in ``dst`` if given."""
        if not self.cuda:
            src = torch.from_numpy(window)
            return src if dst is None else dst.copy_(src)
        rows, cols = window.shape
        target = dst if dst is not None else torch.empty((rows, cols), dtype=torch.uint8, device=self.device)
        step = max(1, self.pinned[0].numel() // max(cols, 1))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            i = self.turn = 1 - self.turn
            self.events[i].synchronize()  # the copy that last read this pinned buffer is done
            host = self.pinned[i][:(r1 - r0) * cols].view(r1 - r0, cols)
            np.copyto(host.numpy(), window[r0:r1])
            with torch.cuda.stream(self.stream):
                target[r0:r1].copy_(host, non_blocking=True)
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


def new_arena(nbytes: int, device: torch.device) -> torch.Tensor:
    """The rank's arena: one uint8 buffer holding every served tensor.

    On the CPU it is an anonymous map populated in one call (MADV_POPULATE_WRITE):
    faulting fresh memory page by page during the copies costs more than the
    copies themselves (0.4-1.5 GB/s against ~10 GB/s into touched memory on
    the bench's 2-core VM; one populate call runs at ~2 GB/s). No
    MADV_HUGEPAGE: with THP defrag on "madvise" the faults stall in
    compaction (0.25 GB/s measured). Elsewhere: ``torch.empty``.
    """
    if device.type != "cpu" or nbytes == 0:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if sys.platform == "linux":
        try:
            mm.madvise(_MADV_POPULATE_WRITE)
        except OSError:  # kernel < 5.14: the pages fault in on first touch instead
            pass
    return torch.frombuffer(mm, dtype=torch.uint8)  # keeps the map alive; unmapped with the last view


class _Hashes:
    """This rank's sha256 share: fed inline while streaming (CPU) or run on worker threads."""

    def __init__(self, ckpt: Checkpoint, names: list[str], threads: int,
                 on_done: Callable[[str], None] | None = None) -> None:
        self.ckpt, self.todo = ckpt, dict.fromkeys(names)
        self.results: dict[str, Future] = {}
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tpload-sha")
        self.on_done = on_done
        """Told each name once its hash is done (inline, or on a worker thread)."""

    def start(self, name: str) -> hashlib._Hash | None:
        """A fresh sha256 if this rank must hash ``name`` and nobody took it yet; the caller feeds it
        every byte of the tensor in order and hands its hex digest to :meth:`finish`."""
        return hashlib.sha256() if self.todo.pop(name, 0) is None and name not in self.results else None

    def finish(self, name: str, hexdigest: str) -> None:
        done: Future = Future()
        done.set_result(hexdigest)
        self.results[name] = done
        if self.on_done is not None:
            self.on_done(name)

    def now(self, name: str) -> None:
        """Hash ``name`` whole on this thread (if it is this rank's to hash)."""
        if self.start(name) is not None:
            self.finish(name, self.ckpt.sha256(name))

    def in_background(self, names: list[str] | None = None) -> None:
        """Hash ``names`` (default: all not yet taken) on the worker threads."""
        for name in list(self.todo) if names is None else names:
            if self.todo.pop(name, 0) is None:
                self.results[name] = self.pool.submit(self.ckpt.sha256, name)
                if self.on_done is not None:
                    self.results[name].add_done_callback(lambda _f, n=name: self.on_done(n))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class _Readahead:
    """Asks the kernel to read the next items' tensors (posix_fadvise WILLNEED) while this one is copied.

    With a warm page cache this is a cheap no-op; with a cold one the disk
    reads overlap the copies instead of stalling on each page fault.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.fds: dict[Path, int] = {}
        self.enabled = hasattr(os, "posix_fadvise")

    def ask(self, item: Item) -> None:
        if not self.enabled:
            return
        for cut in (item.weight, item.scale):
            if cut is None:
                continue
            info = self.ckpt.info(cut.name)
            fd = self.fds.get(info.path)
            if fd is None:
                fd = self.fds[info.path] = os.open(info.path, os.O_RDONLY)
            os.posix_fadvise(fd, info.begin, info.nbytes, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


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


def _decoded_fingerprint(slot: torch.Tensor) -> tuple[torch.Tensor | tuple[int, int, int], torch.Tensor | int]:
    """(fingerprint, non-finite count or flag) of a decoded bf16 slot: one compiled read on the CPU."""
    if slot.device.type == "cpu":
        got = kernels.bf16_fingerprint(slot.view(torch.uint16).numpy())
        if got is not None:
            return got
    return fingerprint(as_bytes2d(slot)), formats.not_finite(slot)


def _decode(item: Item, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    if item.role == "fp4":
        formats.decode_fp4(w, s, out)
    else:
        scale = s.view(torch.float32) if item.scale.dtype == "F32" else s.view(torch.uint8).reshape(item.scale.shape)
        formats.decode_fp8(w.view(torch.uint8).reshape(item.weight.shape), scale, out, block=item.block)


def _stream(ckpt: Checkpoint, cut: Cut, dst: torch.Tensor, sha: hashlib._Hash | None) -> tuple[int, int, int]:
    """CPU: copy ``cut`` into ``dst`` (its 2-D byte slot) and return the slot's fingerprint.

    The copy and the fingerprint are one pass (:class:`kernels.HostFingerprint`).
    When this rank hashes the tensor, it goes one cache-sized row block of the
    whole tensor at a time: the block is fed to ``sha`` (every byte, in order),
    then its window rows are copied while still in the cache, so each byte
    comes from memory once.
    """
    full, (r0, r1), (c0, c1) = ckpt.stored_window(cut.name, cut.rows, cut.cols)
    fp = kernels.HostFingerprint(c1 - c0)
    if not fp.fits(full, c0):
        return _stream_unaligned(full, (r0, r1), (c0, c1), dst, sha)
    out = dst.numpy()
    if sha is None:
        fp.copy(full, (r0, r1), c0, out, 0)
        return fp.value()
    step = max(1, HOST_BLOCK_BYTES // max(full.shape[1], 1))
    for b0 in range(0, full.shape[0], step):
        b1 = min(full.shape[0], b0 + step)
        sha.update(full[b0:b1])
        w0, w1 = max(b0, r0), min(b1, r1)
        if w0 < w1:
            fp.copy(full, (w0, w1), c0, out[w0 - r0:w1 - r0], w0 - r0)
    return fp.value()


def _stream_unaligned(full: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], dst: torch.Tensor,
                      sha: hashlib._Hash | None) -> tuple[int, int, int]:
    """:func:`_stream` for a window whose words are misaligned in the map: torch copy, then fingerprint."""
    if sha is not None:
        sha.update(full)
    dst.copy_(torch.from_numpy(full[rows[0]:rows[1], cols[0]:cols[1]]))
    return tuple(fingerprint(dst, block_bytes=HOST_BLOCK_BYTES).tolist())


def _copy_checked(ckpt: Checkpoint, cut: Cut, slot: torch.Tensor, stager: Stager,
                  hashes: _Hashes) -> tuple[torch.Tensor | tuple[int, int, int], tuple[int, int, int] | None]:
    """The window in its slot; returns (its fingerprint, the host window's fingerprint to match or None).

    On CUDA the device copy is fingerprinted on the device and checked against
    the host window's. On the CPU the slot's fingerprint is taken by the copy
    itself: the served bytes are the words the copy wrote.
    """
    dst = as_bytes2d(slot)
    if stager.cuda:
        window = _window(ckpt, cut)
        stager.put(window, dst)
        return fingerprint(dst), host_fingerprint(window)  # the host side runs while the GPU copies
    sha = hashes.start(cut.name)
    got = _stream(ckpt, cut, dst, sha)
    if sha is not None:
        hashes.finish(cut.name, sha.hexdigest())
    return got, None


def _load_item(ckpt: Checkpoint, item: Item, arena: torch.Tensor, stager: Stager, sample: bool,
               hashes: _Hashes) -> list[_Check]:
    if item.role == "plain":
        out = item.outputs[0]
        slot = _slot(arena, out)
        if item.weight.dtype == "F16":  # served as BF16: convert on the device, check finiteness
            hashes.now(item.weight.name)
            src = stager.put(_window(ckpt, item.weight)).view(torch.float16)
            formats.f16_to_bf16(src, slot.view(src.shape))
            return [_Check(out, item, fingerprint(as_bytes2d(slot)), [_not_finite(slot, "conversion(s) not finite everywhere after F16 -> BF16")])]
        got, want = _copy_checked(ckpt, item.weight, slot, stager, hashes)
        return [_Check(out, item, got, want_fp=want, want_what="host window")]
    if len(item.outputs) == 2:  # packed: the stored bytes of both, as they are
        wo, so = item.outputs
        w_slot, s_slot = _slot(arena, wo), _slot(arena, so)
        w_got, w_want = _copy_checked(ckpt, item.weight, w_slot, stager, hashes)
        s_got, s_want = _copy_checked(ckpt, item.scale, s_slot, stager, hashes)
        w_bad = [_bad_e4m3(w_slot)] if item.role == "fp8" else []
        return [_Check(wo, item, w_got, w_bad, w_want, "host window"),
                _Check(so, item, s_got, [_bad_scale(s_slot, item.scale.dtype)], s_want, "host window")]
    if not stager.cuda:  # the decode reads the map: hash while the pages are hot
        hashes.now(item.weight.name)
        hashes.now(item.scale.name)
    w_np, s_np = _window(ckpt, item.weight), _window(ckpt, item.scale)
    out = item.outputs[0]
    slot = _slot(arena, out)
    w_dev, s_dev = stager.put(w_np), stager.put(s_np)
    bad = [_bad_scale(s_dev, item.scale.dtype)] + ([_bad_e4m3(w_dev)] if item.role == "fp8" else [])
    _decode(item, w_dev, s_dev, slot)
    fp, not_finite = _decoded_fingerprint(slot)
    bad.append((not_finite, "decode(s) not finite everywhere (it overflows bf16, or decodes a bad code)"))
    check = _Check(out, item, fp, bad)
    if sample:
        check.want_fp, check.want_what = _host_decode(item, w_np, s_np), "exact host decode"
    return [check]


def run(ckpt: Checkpoint, plan: RankPlan, *, device: torch.device, to_hash: list[str], hash_threads: int,
        samples_per_role: int, progress: ProgressSink, evict: bool = False, spare_cores: int = 0) -> LoadResult:
    """Load ``plan`` onto ``device``, hashing ``to_hash`` alongside; raise LoadError listing every problem.

    ``evict``: drop each shard's map and page cache once this rank is done with it (pagecache.py).
    ``spare_cores``: cores this rank may use beyond its own thread. On the CPU with none, the
    tensors it reads are hashed inline as they stream by (each byte read once); with some,
    every hash runs on the worker threads while the main thread copies.
    """
    arena = new_arena(plan.arena_bytes, device)
    shard_release = ShardRelease(ckpt, plan.items, to_hash) if evict else None
    threads = max(1, min(hash_threads, spare_cores)) if device.type == "cpu" else hash_threads
    hashes = _Hashes(ckpt, to_hash, threads, on_done=shard_release.hash_done if shard_release else None)
    read = {c.name for i in plan.items for c in (i.weight, i.scale) if c is not None}
    # CPU without a spare core: tensors this rank reads are hashed inline while streamed; the rest on the workers.
    inline = device.type == "cpu" and spare_cores < 1
    hashes.in_background([n for n in to_hash if n not in read] if inline else None)
    ahead = _Readahead(ckpt)
    checks: list[_Check] = []
    role_counts = {r: sum(1 for i in plan.items if i.role == r) for r in ("fp4", "fp8")}
    seen = {"fp4": 0, "fp8": 0}
    max_window = max((max(i.weight.nbytes, i.scale.nbytes if i.scale else 0) for i in plan.items), default=0)
    try:
        for item in plan.items[:READAHEAD_ITEMS]:
            ahead.ask(item)
        with Stager(device, max_window) as stager:
            for k, item in enumerate(plan.items):
                if k + READAHEAD_ITEMS < len(plan.items):
                    ahead.ask(plan.items[k + READAHEAD_ITEMS])
                sample = False
                if item.role in seen and plan.kind == "expanded":
                    sample = _is_sampled(seen[item.role], role_counts[item.role], samples_per_role)
                    seen[item.role] += 1
                checks += _load_item(ckpt, item, arena, stager, sample, hashes)
                if shard_release is not None:
                    shard_release.item_done(item)
                progress.update(item.read_bytes)
        hashes.in_background()  # anything not streamed (none in a tp-only plan)
        result = _settle(ckpt, plan, arena, checks, hashes.results)
    finally:
        hashes.close()
        ahead.close()
        progress.close()
    return result


def _to_host(values: list[torch.Tensor | int | tuple[int, ...]]) -> list:
    """Device tensors among ``values`` as Python numbers, in one transfer; the rest as they are."""
    on_device = [v for v in values if isinstance(v, torch.Tensor)]
    moved = iter(torch.stack(on_device).tolist() if on_device else [])
    return [next(moved) if isinstance(v, torch.Tensor) else v for v in values]


def _settle(ckpt: Checkpoint, plan: RankPlan, arena: torch.Tensor, checks: list[_Check],
            hashes: dict[str, Future]) -> LoadResult:
    """Collect device evidence in one transfer and sha256 results; list every problem."""
    problems: list[str] = []
    fps = _to_host([c.device_fp for c in checks])
    counts = iter(_to_host([n for c in checks for n, _ in c.bad]))
    result = LoadResult(arena, {}, {})
    for c, fp in zip(checks, fps):
        where = f"tensor {c.output.name} ({ckpt.info(c.item.name).file})"
        for (_, what), n in zip(c.bad, counts):
            if n:
                problems.append(f"{where}: {n} {what} in this rank's window")
        if c.want_fp is not None:
            if isinstance(c.want_fp, torch.Tensor):
                c.want_fp = tuple(c.want_fp.tolist())
            if tuple(fp) != c.want_fp:
                problems.append(f"{where}: device bytes differ from the {c.want_what} (fingerprint {fp} != {list(c.want_fp)})")
            elif c.want_what == "exact host decode":
                result.sampled += 1
            else:
                result.device_checked += 1
        result.tensors[c.output.name] = _slot(arena, c.output)
        result.fingerprints[c.output.name] = tuple(fp)
    for name, fut in hashes.items():
        info, got = ckpt.info(name), fut.result()
        want = ckpt.manifest[name].sha256
        result.bytes_hashed += info.nbytes
        result.hashed.append(name)
        if got != want:
            problems.append(sha256_mismatch(info.path, name, got, want))
    if problems:
        raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
    return result

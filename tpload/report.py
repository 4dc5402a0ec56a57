"""What a load reports: per-rank figures, the rank-0 table and JSON, progress, memory peaks.

Every rank's figures travel as one int64 row of the single final exchange
(:func:`tpload.dist.exchange`): counts, nanoseconds, byte peaks, the 32-byte
digest and the UTF-8 error message all packed into integers.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil
import torch

DIGEST_BYTES = 32
MESSAGE_BYTES = 4096
log = logging.getLogger("tpload")


class RankLog(logging.LoggerAdapter):
    """vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

    def process(self, msg, kwargs):  # type: ignore[override]
        return f"[rank {self.extra['rank']}] {msg}", kwargs


def rank_log(rank: int) -> RankLog:
    return RankLog(log, {"rank": rank})


@dataclass
class RankFigures:
    """One rank's figures for one load."""

    rank: int = 0
    failed: int = 0
    node: int = 0
    tensors: int = 0
    """Served tensors (a packed FP4 matrix serves two: weight and scale)."""
    bytes_read: int = 0
    """Window bytes read from the maps (what this rank copies)."""
    bytes_hashed: int = 0
    """Bytes this rank fed to sha256."""
    bytes_device: int = 0
    """Bytes of served tensors on the device."""
    hashed: int = 0
    """Official tensors whose sha256 this rank checked against the manifest."""
    device_checked: int = 0
    """Served tensors whose device fingerprint matched the host window."""
    sampled: int = 0
    """Expanded tensors checked exactly against a host decode."""
    skipped: int = 0
    deferred: int = 0
    ns: int = 0
    """Wall nanoseconds of this rank's load (plan to verified weights)."""
    device_alloc_peak: int = 0
    device_reserved_peak: int = 0
    rss_peak: int = 0
    anon_peak: int = 0
    """Peak anonymous (private, not file-backed) resident memory of the process."""
    page_cache_before: int = -1
    """Page-cache bytes of the checkpoint's shard files when this rank started (mincore); -1: not measured.
    The page cache is the node's, so only the node's first rank measures it (a walk of every page costs
    ~0.1 s a GB)."""
    page_cache_after: int = -1
    """The same when this rank finished (peers on the node may still be loading); measured only when
    the load evicts the page cache, the one case where it says something ``before`` does not."""
    digest: str = ""
    message: str = ""

    _INTS = ("failed", "node", "tensors", "bytes_read", "bytes_hashed", "bytes_device", "hashed", "device_checked",
             "sampled", "skipped", "deferred", "ns", "device_alloc_peak", "device_reserved_peak", "rss_peak",
             "anon_peak", "page_cache_before", "page_cache_after")

    def to_row(self) -> torch.Tensor:
        digest = bytes.fromhex(self.digest) if self.digest else bytes(DIGEST_BYTES)
        msg = self.message.encode()[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0")
        ints = np.array([getattr(self, f) for f in self._INTS], dtype=np.int64)
        blob = np.frombuffer(digest + msg, dtype="<i8")
        return torch.from_numpy(np.concatenate([ints, blob]))

    @classmethod
    def from_row(cls, rank: int, row: torch.Tensor) -> RankFigures:
        vals = row.numpy()
        n = len(cls._INTS)
        blob = vals[n:].astype("<i8").tobytes()
        digest = blob[:DIGEST_BYTES]
        msg = blob[DIGEST_BYTES:].rstrip(b"\0").decode(errors="replace")
        kw = {f: int(v) for f, v in zip(cls._INTS, vals[:n])}
        return cls(rank=rank, digest=digest.hex() if any(digest) else "", message=msg, **kw)

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


@dataclass
class LoadReport:
    """The whole load as rank 0 sees it after the exchange (other ranks hold the same)."""

    checkpoint: str
    kind: str
    tp: int
    ep: int
    verify: str
    device: str
    ranks: list[RankFigures] = field(default_factory=list)
    rank: int = 0
    """The rank holding this report."""
    predictions: str = "none stored"
    """``matched`` when every rank's digest equals the one stored by ``tpload plan --write``."""
    evict_page_cache: bool = False
    """Whether ranks dropped each shard's page cache once done with it."""

    @property
    def mine(self) -> RankFigures:
        return self.ranks[self.rank]

    @property
    def seconds(self) -> float:
        return max((r.seconds for r in self.ranks), default=0.0)

    def total(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.ranks)

    def bytes_hashed_per_node(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.ranks:
            out[r.node] = out.get(r.node, 0) + r.bytes_hashed
        return out

    def to_json(self) -> dict:
        doc = {k: v for k, v in asdict(self).items() if k not in ("ranks", "rank")}
        doc.update(seconds=self.seconds, bytes_read=self.total("bytes_read"),
                   gb_per_s=self.total("bytes_read") / 1e9 / max(self.seconds, 1e-9),
                   bytes_hashed_per_node={str(k): v for k, v in self.bytes_hashed_per_node().items()},
                   ranks=[{k: v for k, v in asdict(r).items()} | {"seconds": r.seconds} for r in self.ranks])
        return doc

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def table(self) -> str:
        gib = 1 << 30
        head = (f"tpload: {self.checkpoint}\n  kind {self.kind}, tp {self.tp} x ep {self.ep}, verify {self.verify}"
                + ("  ** VERIFICATION OFF: bytes served unchecked **" if self.verify == "off" else "")
                + f", device {self.device}\n")
        cols = f"{'rank':>4} {'node':>4} {'tensors':>8} {'read GB':>8} {'hashed GB':>9} {'served GB':>9} {'sec':>7} " \
               f"{'GB/s':>6} {'dev peak GiB':>12} {'rss GiB':>8} {'anon GiB':>8} {'cache GB before>after':>21}  digest"
        lines = [head, cols]
        for r in self.ranks:
            lines.append(f"{r.rank:>4} {r.node:>4} {r.tensors:>8} {r.bytes_read / 1e9:>8.3f} {r.bytes_hashed / 1e9:>9.3f} "
                         f"{r.bytes_device / 1e9:>9.3f} {r.seconds:>7.2f} {r.bytes_read / 1e9 / max(r.seconds, 1e-9):>6.2f} "
                         f"{r.device_alloc_peak / gib:>12.2f} {r.rss_peak / gib:>8.2f} {r.anon_peak / gib:>8.2f} "
                         f"{f'{_gb(r.page_cache_before)}>{_gb(r.page_cache_after)}':>21}  {r.digest[:16]}")
        t = self.total
        lines.append(f"{'all':>4} {'':>4} {t('tensors'):>8} {t('bytes_read') / 1e9:>8.3f} {t('bytes_hashed') / 1e9:>9.3f} "
                     f"{t('bytes_device') / 1e9:>9.3f} {self.seconds:>7.2f} {t('bytes_read') / 1e9 / max(self.seconds, 1e-9):>6.2f}")
        per_node = ", ".join(f"node {n}: {b / 1e9:.3f} GB" for n, b in sorted(self.bytes_hashed_per_node().items()))
        device_fps = ("device fingerprints checked against the host" if self.device.startswith("cuda")
                      else "host-vs-device checks (the CPU copy fingerprints what it writes)")
        lines.append(f"verified: {t('hashed')} tensors by sha256 ({per_node} hashed), {t('device_checked')} {device_fps}, "
                     f"{t('sampled')} exact decodes; digests vs predictions: {self.predictions}; "
                     f"skipped {self.ranks[0].skipped}, deferred {self.ranks[0].deferred}"
                     + ("; page cache evicted shard by shard" if self.evict_page_cache else ""))
        return "\n".join(lines)


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.3f}" if nbytes >= 0 else "-"


class MemoryPeaks:
    """Samples this process's RSS and anonymous memory on a thread (peaks, not ends).

    The kernel keeps a peak RSS (ru_maxrss) but no peak of anonymous memory,
    and anonymous memory is what a loader costs beyond the page cache.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.rss_peak = self.anon_peak = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpload-mem", daemon=True)

    def _sample(self) -> None:
        m = self._proc.memory_info()
        self.rss_peak = max(self.rss_peak, m.rss)
        self.anon_peak = max(self.anon_peak, m.rss - getattr(m, "shared", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemoryPeaks:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class ProgressSink(Protocol):
    """What the load loop reports to: one call per tensor, one at the end."""

    def update(self, nbytes: int) -> None: ...

    def close(self) -> None: ...


class Progress:
    """Rank-0 progress: a live bar on a terminal, plain periodic lines otherwise."""

    def __init__(self, total_bytes: int, total_items: int, *, enabled: bool, every_s: float = 2.0) -> None:
        self.total_bytes, self.total_items, self.every_s = total_bytes, total_items, every_s
        self.enabled = enabled
        self.bytes = self.items = 0
        self.t0 = self._last = time.perf_counter()
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tpload", leave=False)

    def update(self, nbytes: int) -> None:
        if not self.enabled:
            return
        self.bytes += nbytes
        self.items += 1
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            rate = self.bytes / max(now - self.t0, 1e-9)
            eta = (self.total_bytes - self.bytes) / max(rate, 1.0)
            log.info("[rank 0] %d/%d tensors, %.2f/%.2f GB, %.2f GB/s, ETA %.0fs", self.items, self.total_items,
                     self.bytes / 1e9, self.total_bytes / 1e9, rate / 1e9, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

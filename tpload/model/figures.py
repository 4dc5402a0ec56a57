"""One rank's figures for one load, and their wire form for the one exchange.

Every rank's :class:`RankFigures` travels as one int64 row of the final
all-reduce (:mod:`tpload.distributed.exchange`); the row's layout is derived from the
dataclass fields, so a new figure is one new field: integers (``None``, not
measured, travels as -1), then fixed-size byte fields (their size in the
field's metadata), then the per-node-peer cross-check values.
"""

from __future__ import annotations

import time
import typing
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from .modes import PredictionState
from .values import AGREED_BYTES, DIGEST_BYTES, SLOTS

MESSAGE_BYTES = 4096
DEVICE_BYTES = 24  # a multiple of 8 (the row is int64 words), and not DIGEST_BYTES (_pack)
NOT_MEASURED = -1


def _bytes(size: int) -> dict[str, int]:
    return {"bytes": size}


@dataclass
class RankFigures:
    """One rank's figures for one load."""

    rank: int = 0
    node: int = 0
    seq: int = 0
    """Which ``load()`` call of this process in this group (1, 2, ...): ranks in different calls
    must not mix their rows."""
    failed: int = 0
    """How the rank's load ended (a RankStatus): 0 ok, 1 failed, 2 stopped because another
    failed."""
    tensors: int = 0
    """Served tensors (a packed FP4 matrix serves two: weight and scale)."""
    bytes_read: int = 0
    """Window bytes of this rank's plan: every window it serves, wherever the bytes came from
    (docs/format.md, "The report's byte counters")."""
    bytes_from_storage: int | None = None
    """With replicas: the window bytes of :attr:`bytes_read` this rank read from storage itself;
    None: no replicas (every window was)."""
    bytes_from_peers: int | None = None
    """With replicas: the window bytes of :attr:`bytes_read` this rank received from its replica
    peers (with :attr:`bytes_from_storage`, they add up to :attr:`bytes_read`)."""
    bytes_hashed: int = 0
    """Bytes this rank fed to its content hash."""
    bytes_device: int = 0
    """Bytes of served tensors on the device."""
    hashed: int = 0
    """Official tensors whose content hash this rank checked (sha256 against the manifest, or
    blake3)."""
    blake3: int = 0
    """1: this rank checked its share by blake3 against the operator's sidecar
    (verification/store.py's sidecar); 0: by sha256 against the manifest (or the mode hashes
    nothing)."""
    device_checked: int = 0
    """Served tensors whose device fingerprint matched the host window."""
    sampled: int = 0
    """Decoded tensors checked exactly against an independent host decode."""
    skipped: int = 0
    deferred: int = 0
    ns: int = 0
    """Wall nanoseconds of this rank's load (plan to verified weights)."""
    open_ns: int = 0
    """Of :attr:`ns`, the phases (report/progress.py's PHASES): the node names, the index, headers
    and pins."""
    plan_ns: int = 0
    """The config, the plans, the pre-flight and the gate's preparation."""
    handshake_ns: int = 0
    """The wait for every rank at the handshake (long on a rank whose peers were slower to get
    there)."""
    read_ns: int = 0
    """The copy loop, its hashes and the rank's own checks, to its arrival at the exchange."""
    device_alloc_peak: int | None = None
    """CUDA allocator peaks of the load's device; None on the CPU (the arena is host memory: see
    rss)."""
    device_reserved_peak: int | None = None
    rss_peak: int = 0
    anon_peak: int = 0
    """Peak anonymous (private, not file-backed) resident memory of the process."""
    page_cache_before: int | None = None
    """Page-cache bytes of the checkpoint's files when the load started (mincore, sampled); the page
    cache is the node's, so only the node's first rank measures it. None: not measured."""
    page_cache_after: int | None = None
    """The same when this rank finished (measured only when the load evicts the page cache)."""
    first_read_ns: int | None = None
    """Nanoseconds from this ``load()``'s entry (its group made) to the start of its per-tensor
    loop, whose first steps are the arena's allocation and the first read of weight bytes; None:
    it failed before."""
    first_call_ns: int | None = None
    """On the process's first ``load()`` only: ``first_read_ns`` plus the import of the load path
    (``tpload.api``, timed when ``tpload.load`` is first asked for), so the once-per-process work
    that stands before the loop (the kernels load on a thread beside it, see kernels/lazy.py).
    None on later loads, and when the load failed before."""
    attest: int = 0
    """1: this rank writes the load attestation after a passed verdict (``--attest``). Rank 0's
    decides: every rank then learns whether it was written (exchange.agree) before returning."""
    prediction: int = PredictionState.NONE
    """This rank's digest against a stored prediction (a PredictionState)."""
    pushed_version: int = 0
    """A refresh (refresh/engine.py): the version of the manifest this engine rank took (0: a load,
    or no manifest arrived); the verdict refuses rows that verified different manifests."""
    digest: str = field(default="", metadata=_bytes(DIGEST_BYTES))
    device: str = field(default="", metadata=_bytes(DEVICE_BYTES))
    """The device this rank served on (``cuda:3``, ``cpu``): the attestation records it."""
    message: str = field(default="", metadata=_bytes(MESSAGE_BYTES))
    pushed_sha256: str = field(default="", metadata=_bytes(DIGEST_BYTES))
    """A refresh: the sha256 of that manifest's bytes (empty: a load)."""
    replicas_sent: str = field(default="", metadata=_bytes(DIGEST_BYTES))
    """Replicas: the fold of every window this rank read and sent (sources/replicas.py); empty:
    none."""
    replicas_seen: str = field(default="", metadata=_bytes(DIGEST_BYTES))
    """Replicas: the folds of the windows it received, one per sender, XOR-ed."""
    agreed: str = field(default="", metadata=_bytes(AGREED_BYTES))
    """What this rank loaded and how, as the handshake's hashes (distributed/agreement.py), for the
    verdict to compare again; empty: it did not pass the handshake."""
    claims: list[bytes] = field(default_factory=lambda: [bytes(DIGEST_BYTES)] * SLOTS)
    """Node mode: what this rank, as hasher, says each node peer's windows hold
    (verification/node.py)."""
    seen: list[bytes] = field(default_factory=lambda: [bytes(DIGEST_BYTES)] * SLOTS)
    """Node mode: what this rank read of the tensors each node peer hashed."""

    @property
    def seconds(self) -> float:
        return self.ns / 1e9

    def phase_seconds(self, slowest_read_ns: int) -> dict[str, float]:
        """Seconds this rank spent in each phase; the exchange's is its wait for the slowest rank
        (``slowest_read_ns``: the longest read of the ranks that passed the handshake, which every
        rank leaves together), so the rank that held the load has the shortest wait."""
        return {
            "open": self.open_ns / 1e9,
            "plan": self.plan_ns / 1e9,
            "handshake": self.handshake_ns / 1e9,
            "read": self.read_ns / 1e9,
            "exchange": max(slowest_read_ns - self.read_ns, 0) / 1e9,
        }

    @property
    def first_call_seconds(self) -> float | None:
        """:attr:`first_call_ns` in seconds (None where it is)."""
        return None if self.first_call_ns is None else self.first_call_ns / 1e9

    def read_started(self, since_ns: int, *, imports_ns: int | None) -> None:
        """The load's per-tensor loop (and with it its first read) begins now; ``since_ns``: the
        load's entry; ``imports_ns``: on the process's first load, what importing the load path
        took (report/imports.py), else None."""
        self.first_read_ns = time.perf_counter_ns() - since_ns
        if imports_ns is not None:
            self.first_call_ns = imports_ns + self.first_read_ns

    # -- wire --------------------------------------------------------------------------------------

    @classmethod
    def _layout(cls) -> tuple[list[str], list[tuple[str, int]]]:
        hints = typing.get_type_hints(cls)
        ints = [f.name for f in fields(cls) if hints[f.name] in (int, int | None)]
        blobs = [(f.name, f.metadata["bytes"]) for f in fields(cls) if "bytes" in f.metadata]
        return ints, blobs

    @classmethod
    def row_size(cls) -> int:
        """int64 words in a row: the same on every rank, whatever it knows (a fixed layout)."""
        ints, blobs = cls._layout()
        return len(ints) + (sum(n for _, n in blobs) + 2 * SLOTS * DIGEST_BYTES) // 8

    def to_row(self) -> torch.Tensor:
        peers = SLOTS
        ints, blobs = self._layout()
        own = vars(self)  # the fields by name, as _layout lists them
        head = np.array([NOT_MEASURED if own[f] is None else own[f] for f in ints], dtype=np.int64)
        raw = b"".join(_pack(own[name], size) for name, size in blobs)
        for values in (self.claims, self.seen):
            raw += b"".join(values[:peers]).ljust(peers * DIGEST_BYTES, b"\0")
        return torch.from_numpy(np.concatenate([head, np.frombuffer(raw, dtype="<i8")]))

    @classmethod
    def from_row(cls, row: torch.Tensor) -> RankFigures:
        peers = SLOTS
        ints, blobs = cls._layout()
        hints = typing.get_type_hints(cls)
        vals = row.numpy()
        # each field by name, as the layout (the dataclass's own hints) reads it from the row
        kw: dict[str, Any] = {}
        for name, v in zip(ints, vals[: len(ints)], strict=True):
            kw[name] = None if hints[name] == int | None and v == NOT_MEASURED else int(v)
        raw, at = vals[len(ints) :].astype("<i8").tobytes(), 0
        for name, size in blobs:
            kw[name] = _unpack(name, raw[at : at + size])
            at += size
        for name in ("claims", "seen"):
            kw[name] = [
                raw[at + i * DIGEST_BYTES : at + (i + 1) * DIGEST_BYTES] for i in range(peers)
            ]
            at += peers * DIGEST_BYTES
        return cls(**kw)


def _pack(value: str, size: int) -> bytes:
    """A digest (hex) as its bytes; any other text as UTF-8, cut to ``size`` on a character
    boundary."""
    if size == DIGEST_BYTES:
        return bytes.fromhex(value) if value else bytes(size)
    raw = value.encode()[:size]
    return raw.decode(errors="ignore").encode().ljust(size, b"\0")


def _unpack(name: str, raw: bytes) -> str:
    if len(raw) == DIGEST_BYTES:  # a digest (hex); _pack packs every field of this size as one
        return raw.hex() if any(raw) else ""
    return raw.rstrip(b"\0").decode(errors="replace")

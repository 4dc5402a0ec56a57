"""The whole load as every rank sees it after the exchange: the rank-0 table and the JSON report."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..model.figures import RankFigures
from ..model.modes import PredictionState
from ..model.text import printable
from ..model.trust import TrustSource
from ..storage.files import STDOUT, atomic_write

GIB = 1 << 30
PREDICTION = {
    PredictionState.NONE: "none stored",
    PredictionState.MATCH: "matched",
    PredictionState.DIFFERS: "differs",
}  # RankFigures.prediction, as the table words it


class Totals(NamedTuple):
    """The ranks' figures summed: the table's ``all`` row."""

    tensors: int
    bytes_read: int
    bytes_hashed: int
    bytes_device: int
    hashed: int
    device_checked: int
    sampled: int


@dataclass
class LoadReport:
    """The whole load as rank 0 sees it after the exchange (every rank holds the same)."""

    checkpoint: str
    kind: str
    tp: int
    ep: int
    verify: str
    device: str
    ranks: list[RankFigures] = field(default_factory=list)
    rank: int = 0
    """The rank holding this report."""
    predictions_trusted: bool = False
    """``--verify digest``: the stored digests were trusted in place of hashing (what vouched, for
    every mode, is :attr:`trust`)."""
    trust: TrustSource | None = None
    """The trust source the served bytes were checked against (model/trust.py): kind,
    file, sha256, signer; None where no verdict made one (a report made by hand)."""
    evict_page_cache: bool = False
    """Whether ranks dropped each shard's page cache once done with it."""
    notes: list[str] = field(default_factory=list)
    """Warnings every rank agrees on (what the load assumed or could not measure)."""
    weight_prefix: str | None = None
    """The prefix the checkpoint's layers are stored under (``model.``; ``""``: none; None: no
    layers)."""
    kv_scales: dict[str, object] = field(default_factory=dict)
    """The KV-cache scale census (selection/kvscales.py): each layer's stored scales and vLLM's
    names for them."""

    @property
    def mine(self) -> RankFigures:
        return self.ranks[self.rank]

    @property
    def seconds(self) -> float:
        return max((r.seconds for r in self.ranks), default=0.0)

    @property
    def predictions(self) -> str:
        """Every rank's digest against the stored prediction: ``matched`` only if every rank
        matched."""
        states = {r.prediction for r in self.ranks}
        word = PREDICTION[PredictionState(max(states, default=PredictionState.NONE))]
        if word == "matched" and len(states) > 1:
            word = "partly stored"
        return word + (
            " (sha256-verified when written; trusted in place of hashing)"
            if self.predictions_trusted and word == "matched"
            else ""
        )

    @property
    def hash(self) -> str | None:
        """The content hash the load proved bytes with: ``sha256`` (the manifest's), ``blake3`` (the
        operator's sidecar), ``mixed`` (ranks differed; each rank's ``blake3`` figure says which);
        None when the mode hashes nothing (digest, off)."""
        if self.verify not in ("node", "rank"):
            return None
        used = {r.blake3 for r in self.ranks}
        return "mixed" if len(used) > 1 else "blake3" if used == {1} else "sha256"

    def _by_hash(self) -> str:
        if self.hash != "mixed":
            return self.hash or "sha256"
        on = {b: ", ".join(str(r.rank) for r in self.ranks if r.blake3 == b) for b in (0, 1)}
        return f"blake3 on rank {on[1]} and sha256 on rank {on[0]}"

    def totals(self) -> Totals:
        """The ranks' figures summed (the table's ``all`` row)."""
        rs = self.ranks
        return Totals(
            sum(r.tensors for r in rs),
            sum(r.bytes_read for r in rs),
            sum(r.bytes_hashed for r in rs),
            sum(r.bytes_device for r in rs),
            sum(r.hashed for r in rs),
            sum(r.device_checked for r in rs),
            sum(r.sampled for r in rs),
        )

    def bytes_hashed_per_node(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.ranks:
            out[r.node] = out.get(r.node, 0) + r.bytes_hashed
        return out

    def slowest_rank(self) -> int | None:
        """The rank whose read (copy loop and checks) took longest: the one the others waited for
        at the exchange (None: no rank read)."""
        reading = [r for r in self.ranks if r.read_ns > 0]
        return max(reading, key=lambda r: r.read_ns).rank if reading else None

    def to_dict(self) -> dict[str, object]:
        """Everything in the report as plain JSON values (figures not measured are None)."""
        slowest = max((r.read_ns for r in self.ranks), default=0)
        read = self.totals().bytes_read
        doc = {k: v for k, v in asdict(self).items() if k not in ("ranks", "rank")}
        doc.update(
            ok=not any(r.failed for r in self.ranks),
            trust=self.trust.to_dict() if self.trust is not None else None,
            hash=self.hash,
            predictions=self.predictions,
            seconds=self.seconds,
            bytes_read=read,
            gb_per_s=read / 1e9 / max(self.seconds, 1e-9),
            bytes_hashed_per_node={str(k): v for k, v in self.bytes_hashed_per_node().items()},
            ranks=[
                {k: v for k, v in asdict(r).items() if k not in ("claims", "seen")}
                | {
                    "seconds": r.seconds,
                    "first_call_seconds": r.first_call_seconds,
                    "phase_seconds": r.phase_seconds(slowest),
                }
                for r in self.ranks
            ],
            slowest_rank=self.slowest_rank(),
        )
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write(self, path: str | os.PathLike[str], *, error: str | None = None) -> None:
        """Write the JSON report (beside it first, then renamed: never half a report); ``-``: on
        standard output (the command line then prints its table on standard error). ``error``: a
        failed load's message, whole (``ok`` false, ``error`` its first line, ``problems`` the
        rest: every one, where the terminal shows the first 20 of a list)."""
        doc = self.to_dict()
        if error is not None:
            first, *rest = error.splitlines() or [""]
            doc.update(ok=False, error=first, problems=rest)
        text = json.dumps(doc, indent=2) + "\n"
        if os.fspath(path) == STDOUT:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        atomic_write(Path(path), text)

    def table(self) -> str:
        """The rank-0 table (every name in it escaped for the terminal)."""
        off = (
            "  ** VERIFICATION OFF: bytes served unchecked (no manifest, blob name, etag or "
            "signature consulted) **"
            if self.verify == "off"
            else ""
        )
        head = (
            f"tpload: {printable(self.checkpoint)}\n"
            f"  kind {self.kind}, tp {self.tp} x ep {self.ep}, "
            f"verify {self.verify}{off}, device {self.device}\n"
        )
        # at most 100 columns (a terminal's usual width): the anonymous-memory peak and every
        # other figure are in the JSON report; the page cache is "before>after"
        cols = (
            f"{'rank':>4} {'node':>4} {'tensors':>7} {'read GB':>7} {'hash GB':>7} "
            f"{'served GB':>9} {'sec':>6} {'GB/s':>5} {'dev GiB':>7} {'rss GiB':>7} "
            f"{'cache GB':>9}  digest"
        )
        lines = [head, cols]
        for r in self.ranks:
            dev = f"{r.device_alloc_peak / GIB:.2f}" if r.device_alloc_peak is not None else "-"
            cache = f"{_gb(r.page_cache_before)}>{_gb(r.page_cache_after)}"
            lines.append(
                f"{r.rank:>4} {r.node:>4} {r.tensors:>7} {r.bytes_read / 1e9:>7.3f} "
                f"{r.bytes_hashed / 1e9:>7.3f} {r.bytes_device / 1e9:>9.3f} {r.seconds:>6.2f} "
                f"{r.bytes_read / 1e9 / max(r.seconds, 1e-9):>5.2f} {dev:>7} "
                f"{r.rss_peak / GIB:>7.2f} {cache:>9}  {r.digest[:16]}"
            )
        t = self.totals()
        lines.append(
            f"{'all':>4} {'':>4} {t.tensors:>7} {t.bytes_read / 1e9:>7.3f} "
            f"{t.bytes_hashed / 1e9:>7.3f} {t.bytes_device / 1e9:>9.3f} {self.seconds:>6.2f} "
            f"{t.bytes_read / 1e9 / max(self.seconds, 1e-9):>5.2f}"
        )
        if any(r.bytes_from_peers is not None for r in self.ranks):
            lines.append(_replicas_line(self.ranks))
        per_node = ", ".join(
            f"node {n}: {b / 1e9:.3f} GB" for n, b in sorted(self.bytes_hashed_per_node().items())
        )
        device_fps = (
            "device fingerprints checked against the host window"
            if self.device.startswith("cuda")
            else "host-vs-device checks (on the CPU the copy fingerprints what it writes)"
        )
        against = f" against {self.trust.words(self.checkpoint)}" if self.trust is not None else ""
        lines.append(
            f"verified: {t.hashed} tensors by {self._by_hash()} ({per_node} hashed){against}, "
            f"{t.device_checked} {device_fps}, "
            f"{t.sampled} independent decodes; digests vs predictions: {self.predictions}; "
            f"skipped {self.ranks[0].skipped}, deferred {self.ranks[0].deferred}"
            + ("; page cache evicted shard by shard" if self.evict_page_cache else "")
        )
        lines += [f"note: {printable(n)}" for n in self.notes]
        return "\n".join(lines)


def _replicas_line(ranks: list[RankFigures]) -> str:
    """Replicas: each rank's window bytes from storage and from peers, as counted, and each
    node's."""
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        got = nodes.setdefault(r.node, [0, 0])
        got[0] += r.bytes_from_storage or 0
        got[1] += r.bytes_from_peers or 0
    per_rank = ", ".join(
        f"{r.rank}: {_gb(r.bytes_from_storage)}/{_gb(r.bytes_from_peers)}" for r in ranks
    )
    per_node = ", ".join(
        f"node {n}: {a / 1e9:.3f}/{b / 1e9:.3f}" for n, (a, b) in sorted(nodes.items())
    )
    storage = sum(r.bytes_from_storage or 0 for r in ranks)
    return (
        f"replicas: GB from storage/from peers per rank {per_rank}; per node {per_node}; "
        f"{storage / 1e9:.3f} GB read from storage by the cluster"
    )


def _gb(nbytes: int | None) -> str:
    return f"{nbytes / 1e9:.3f}" if nbytes is not None else "-"

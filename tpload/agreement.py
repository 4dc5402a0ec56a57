"""What every rank of a load must agree on, proved in one handshake before any window is read.

Ranks that load different things must not serve together: a node serving bytes hashed against
another node's manifest, replicas mixing two checkpoints, a receiver that asked for verification
serving what its peer read unverified. So before the copy loop every rank, failed or not, meets the
others once (exchange.py's :func:`~tpload.exchange.handshake`: one small int64 row a rank) with its
status and what it is about to load: one 64-bit hash of each of :data:`FIELDS` (the trust anchor's
identity, the config, every option that shapes the served bytes) and the first bytes of each value,
to name it. Every rank then holds every row and reaches the same decision:

* a rank failed before the handshake (a wrong pin, a missing shard, an option refused): the others
  stop at once (errors.StoodDown) and go straight to the exchange, where the verdict prints the
  failed rank's own message, in seconds rather than after ``--timeout``;
* the ranks differ: every rank fails, naming the first field that differs, the ranks on each side
  and their values.

The exchange's row carries the hashes again (``RankFigures.agreed``), and the verdict refuses rows
that differ (verification/gate.py's ``judge``): no load passes on a table whose ranks disagree.

What it proves: every rank loads through the same anchor with the same options, so copies or
settings that differ are refused. Not that a peer tells the truth: a hostile rank can send any row
(docs/threat-model.md, "Replicas").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import LoadError, StoodDown
from .exchange import handshake
from .modes import RankStatus
from .text import escape_name

log = logging.getLogger("tpload")

FIELDS = (
    ("verify", "the verify mode", "give every rank the same --verify"),
    ("kind", "the kind", "give every rank the same --kind"),
    ("tp", "tp", "give every rank the same --tp"),
    ("ep", "ep", "give every rank the same --ep"),
    ("replicas", "the replicas", "give every rank the same --replicas (or replica_group)"),
    ("skip", "the skip globs", "give every rank the same --skip globs"),
    ("defer", "the defer globs", "give every rank the same --defer globs"),
    (
        "skip_activation_scales",
        "skip_activation_scales",
        "give every rank the same --skip-activation-scales",
    ),
    ("config", "the config", "give every rank the same --config (and the same config.json)"),
    (
        "anchor",
        "the trust anchor",
        "every node must hold the same checkpoint: check each copy with `python -m tpload verify "
        "DIR`, and pin it with --manifest-sha256 HEX on every rank",
    ),
)
"""(name, what a message calls it, the fix), in the order a difference is named: the options a
rank was given first, then what it found (the config, the anchor)."""
SHOWN_BYTES = 64
"""Bytes of each value a row carries to name it (a multiple of 8: the row is int64 words)."""
HEAD = 2  # the call's sequence number, the rank's status
WORDS = HEAD + len(FIELDS) + len(FIELDS) * SHOWN_BYTES // 8
AGREED_BYTES = 16 * len(FIELDS)
"""The hashes as hex in the exchange's row (``RankFigures.agreed``)."""


def _hash(value: str) -> int:
    raw = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(raw[:8], "little", signed=True)


def _shown(value: str) -> bytes:
    """The first :data:`SHOWN_BYTES` of a value (cut on a character boundary, ``...`` where cut)."""
    raw = value.encode("utf-8", "backslashreplace")
    if len(raw) > SHOWN_BYTES:
        raw = raw[: SHOWN_BYTES - 3].decode(errors="ignore").encode() + b"..."
    return raw.ljust(SHOWN_BYTES, b"\0")


def _globs(globs: Sequence[str]) -> str:
    return ", ".join(sorted(set(globs))) or "none"


@dataclass(frozen=True)
class Terms:
    """What this rank is about to load, one value per field of :data:`FIELDS`: ``values`` are
    hashed (and compared), ``shown`` name them in a message."""

    values: tuple[str, ...]
    shown: tuple[str, ...]

    @classmethod
    def of(
        cls,
        opts: object,
        layout: object,
        config: object,
        anchor: str,
        placement: object | None,
    ) -> Terms:
        """``anchor``: the gate's strategy's (Strategy.anchor); ``placement``: where the replicas
        stand (replicas.placement's, None without replicas)."""
        replicas, groups = "1", placement.groups if placement is not None else None
        if groups:
            n, size = len(groups[0]), len(groups)
            in_order = [[q * size + p for q in range(n)] for p in range(size)]
            placed = [list(g) for g in groups]
            replicas = str(n) if placed == in_order else f"{n}, placed {placed}"
        cid = config.id()
        values = {
            "verify": str(opts.verify),
            "kind": str(opts.kind),
            "tp": str(layout.tp),
            "ep": str(layout.ep),
            "replicas": replicas,
            "skip": _globs(opts.skip),
            "defer": _globs(opts.defer),
            "skip_activation_scales": "on" if opts.skip_activation_scales else "off",
            "config": cid,
            "anchor": anchor,
        }
        shown = dict(values, config=f"{config.name} (id {cid})")
        return cls(tuple(values[f] for f, _, _ in FIELDS), tuple(shown[f] for f, _, _ in FIELDS))

    def hashes(self) -> list[int]:
        return [_hash(v) for v in self.values]

    def hex(self) -> str:
        """The hashes for the exchange's row (16 hex digits a field)."""
        return "".join((h & (2**64 - 1)).to_bytes(8, "big").hex() for h in self.hashes())


def row(seq: int, status: int, terms: Terms | None) -> torch.Tensor:
    """This rank's handshake row: the call, its status, and (when it got that far) its terms."""
    out = np.zeros(WORDS, dtype=np.int64)
    out[0], out[1] = seq, status
    if terms is not None:
        out[HEAD : HEAD + len(FIELDS)] = terms.hashes()
        shown = b"".join(_shown(s) for s in terms.shown)
        out[HEAD + len(FIELDS) :] = np.frombuffer(shown, dtype="<i8")
    return torch.from_numpy(out)


def _ranks(ranks: Sequence[int]) -> str:
    """``0-3, 6, 8, 9``: a rank list, runs of three or more shortened (a cluster's nodes are
    runs)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(
        f"{a}-{b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))) for a, b in runs
    )


def differences(table: torch.Tensor) -> str | None:
    """The first field the rows differ in, worded (every rank words the same table alike): which
    ranks hold which value, escaped; None when every row holds the same terms."""
    rows = table.numpy()
    hashes = rows[:, HEAD : HEAD + len(FIELDS)]
    differ = [k for k in range(len(FIELDS)) if len(set(hashes[:, k].tolist())) > 1]
    if not differ:
        return None
    k = differ[0]
    _, what, fix = FIELDS[k]
    sides: dict[int, list[int]] = {}
    for r, h in enumerate(hashes[:, k].tolist()):
        sides.setdefault(h, []).append(r)
    raw = rows[:, HEAD + len(FIELDS) :].astype("<i8").tobytes()
    width = len(FIELDS) * SHOWN_BYTES

    def shown(r: int) -> str:
        cut = raw[r * width + k * SHOWN_BYTES : r * width + (k + 1) * SHOWN_BYTES]
        return escape_name(cut.rstrip(b"\0").decode(errors="replace"))

    values = [shown(who[0]) for who in sides.values()]
    said = [
        f"rank {_ranks(who)}: '{v}'" for who, v in zip(sides.values(), values[:4], strict=False)
    ]
    more = f"; and {len(sides) - 4} more value(s)" if len(sides) > 4 else ""
    if len(set(values)) < len(values):  # a row carries a value's first bytes only
        more += f"; they differ after the first {SHOWN_BYTES} bytes"
    also = [FIELDS[j][1] for j in differ[1:]]
    return (
        f"the ranks do not load the same thing the same way: they differ in {what} "
        f"({'; '.join(said)}{more})" + (f", and in {', '.join(also)}" if also else "") + f"; {fix}"
    )


def decide(table: torch.Tensor) -> None:
    """What a rank that is ready makes of the handshake's table (every such rank alike): return
    when it may copy; StoodDown when another rank failed first (or is in another call); LoadError
    naming the first difference."""
    rows = table.numpy()
    if len(set(rows[:, 0].tolist())) > 1:  # the exchange's verdict says which calls
        raise StoodDown("the ranks are in different load() calls")
    stopped = [r for r in range(len(rows)) if rows[r, 1] != RankStatus.OK]
    if stopped:
        raise StoodDown(f"stopped before the copy loop: rank {_ranks(stopped)} failed before it")
    differ = differences(table)
    if differ:
        raise LoadError(differ)


class Handshake:
    """The one handshake of a ``load()`` call, met exactly once by every rank whatever failed
    before it (a rank that failed goes with its status: its peers stop instead of waiting)."""

    def __init__(self, seq: int, timeout_s: float) -> None:
        self.seq, self.timeout_s = seq, timeout_s
        self.met = False
        self.lost: LoadError | None = None
        """The collective itself failed (a peer died or hung): no exchange can follow."""
        self.before = ""
        """This rank's own failure before the handshake (its message), if any."""

    def meet(self, fig: object, ctx: object, terms: Terms | None) -> None:
        """Meet the other ranks with ``fig``'s status and ``terms`` (None: this rank failed before
        it). Returns when every rank may copy; raises StoodDown when another rank failed first,
        LoadError naming the first difference, or LoadError when the group is lost."""
        self.met = True
        status = fig.failed or (RankStatus.FAILED if terms is None else RankStatus.OK)
        failed = status != RankStatus.OK
        self.before = fig.message if failed else ""
        try:
            table = handshake(
                row(self.seq, status, terms), ctx, seq=self.seq, timeout_s=self.timeout_s
            )
        except LoadError as e:
            self.lost = e
            raise
        if not failed:
            decide(table)
            fig.agreed = terms.hex()

    def unmet(self, fig: object, ctx: object) -> None:
        """Meet it now if this rank failed before it (its status goes to its peers); a group lost
        there is kept for :meth:`raise_lost`."""
        if not self.met:
            with contextlib.suppress(LoadError):
                self.meet(fig, ctx, None)

    def raise_lost(self) -> None:
        """Raise the lost group's error (with this rank's own failure, if it had one first)."""
        if self.lost is not None:
            raise LoadError("\n".join(m for m in (self.before, str(self.lost)) if m))


def outcome(rank: int, e: BaseException) -> tuple[RankStatus, str]:
    """A failure before the exchange as this rank's status and message (its rows')."""
    if isinstance(e, StoodDown):
        return RankStatus.STOOD_DOWN, f"rank {rank}: {e}"
    if isinstance(e, LoadError):
        return RankStatus.FAILED, f"rank {rank}: {e}"
    if isinstance(e, KeyboardInterrupt):
        return RankStatus.FAILED, f"rank {rank}: interrupted (Ctrl-C)"
    log.debug("[rank %d] load failed", rank, exc_info=e)  # a bug or an OS error
    return RankStatus.FAILED, f"rank {rank}: unexpected {type(e).__name__}: {escape_name(e)}"


def disagreement(ranks: Sequence[object]) -> list[str]:
    """From the exchanged rows (the verdict's second look): a passed rank whose row does not say
    what it loaded, or rows whose terms differ, naming the first field and the ranks by hash."""
    silent = [r.rank for r in ranks if len(r.agreed) != AGREED_BYTES]
    if silent:
        return [f"rank {_ranks(silent)}: its row does not say what it loaded (no handshake)"]
    for k, (_, what, fix) in enumerate(FIELDS):
        sides: dict[str, list[int]] = {}
        for r in ranks:
            sides.setdefault(r.agreed[16 * k : 16 * (k + 1)], []).append(r.rank)
        if len(sides) > 1:
            said = "; ".join(f"rank {_ranks(who)}: hash {h}" for h, who in sides.items())
            return [f"the ranks' rows differ in {what} ({said}); {fix}"]
    return []

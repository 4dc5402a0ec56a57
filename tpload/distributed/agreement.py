"""What every rank of a load must agree on, proved in one handshake before any window is read.

Ranks that load different things must not serve together: a node serving bytes hashed against
another node's manifest, replicas mixing two checkpoints, a receiver that asked for verification
serving what its peer read unverified. So before the copy loop every rank, failed or not, meets the
others once (exchange.py's :func:`~tpload.distributed.exchange.handshake`: one small int64 row a
rank) with its status and what it is about to load: one 64-bit hash of each of :data:`FIELDS` (the
trust anchor's identity, the config, every option that shapes the served bytes) and the first bytes
of each value, to name it. Every rank then holds every row and reaches the same decision:

* a rank failed before the handshake (a wrong pin, a missing shard, an option refused): the others
  stop at once (errors.StoodDown) and go straight to the exchange, where the verdict prints the
  failed rank's own message, in seconds rather than after ``--timeout``;
* the ranks differ: every rank fails, naming the first field that differs, the ranks on each side
  and their values.

The exchange's row carries the hashes again (``RankFigures.agreed``), and the verdict refuses rows
that differ (verification/gate.py's ``judge``, with verification/terms.py's check): no load passes
on a table whose ranks disagree.

What it proves: every rank loads through the same anchor with the same options, so copies or
settings that differ are refused. Not that a peer tells the truth: a hostile rank can send any row
(docs/threat-model.md, "Replicas").
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from ..model.errors import LoadError, StoodDown
from ..model.figures import RankFigures
from ..model.modes import RankStatus
from ..model.text import escape_name, rank_ranges
from ..verification.terms import FIELDS, SHOWN_BYTES, Terms, shown_bytes
from . import versions
from .exchange import handshake
from .world import DistContext

log = logging.getLogger("tpload")

HEADER = 3  # versions.MAGIC, versions.FORMAT, the row's length in words: checked before use
HEAD = HEADER + 2  # then the call's sequence number, the rank's status
WORDS = HEAD + len(FIELDS) + len(FIELDS) * SHOWN_BYTES // 8


def row(seq: int, status: int, terms: Terms | None) -> torch.Tensor:
    """This rank's handshake row: the header, the call, its status, and (when it got that far)
    its terms."""
    out: np.ndarray = np.zeros(WORDS, dtype=np.int64)
    out[:HEAD] = versions.MAGIC, versions.FORMAT, WORDS, seq, status
    if terms is not None:
        out[HEAD : HEAD + len(FIELDS)] = terms.hashes()
        shown = b"".join(shown_bytes(s) for s in terms.shown)
        out[HEAD + len(FIELDS) :] = np.frombuffer(shown, dtype="<i8")
    return torch.from_numpy(out)


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
        f"rank {rank_ranges(who)}: '{v}'"
        for who, v in zip(sides.values(), values[:4], strict=False)
    ]
    more = f"; and {len(sides) - 4} more value(s)" if len(sides) > 4 else ""
    if len(set(values)) < len(values):  # a row carries a value's first bytes only
        more += f"; they differ after the first {SHOWN_BYTES} bytes"
    also = [FIELDS[j][1] for j in differ[1:]]
    return (
        f"the ranks do not load the same thing the same way: they differ in {what} "
        f"({'; '.join(said)}{more})" + (f", and in {', '.join(also)}" if also else "") + f"; {fix}"
    )


def foreign(table: torch.Tensor, rank: int) -> versions.Incompatible | None:
    """The ranks whose row does not lead with this tpload's header (another format, or no
    header: a tpload from before it), named before anything of a row is read as terms; None when
    every row is this format's."""
    rows = table.numpy()
    want = [versions.MAGIC, versions.FORMAT, WORDS]
    bad = [r for r in range(len(rows)) if rows[r, :HEADER].tolist() != want]
    if not bad:
        return None
    said = "; ".join(
        f"rank {r}: magic {int(rows[r, 0]) & (2**64 - 1):#018x}, format {int(rows[r, 1])}, "
        f"length {int(rows[r, 2])}"
        for r in bad[:4]
    )
    return versions.Incompatible(
        f"rank {rank}: the handshake rows of rank {rank_ranges(bad)} are not this tpload's "
        f"(magic {versions.MAGIC & (2**64 - 1):#018x}, format {versions.FORMAT}, length {WORDS}; "
        f"{said}); every rank must run the same tpload ({versions.stamp()} here)"
    )


def decide(table: torch.Tensor) -> None:
    """What a rank that is ready makes of the handshake's table (every such rank alike): return
    when it may copy; StoodDown when another rank failed first (or is in another call); LoadError
    naming the first difference. The headers were checked first (:func:`foreign`)."""
    rows = table.numpy()[:, HEADER:]
    if len(set(rows[:, 0].tolist())) > 1:  # the exchange's verdict says which calls
        raise StoodDown("the ranks are in different load() calls")
    stopped = [r for r in range(len(rows)) if rows[r, 1] != RankStatus.OK]
    if stopped:
        raise StoodDown(
            f"stopped before the copy loop: rank {rank_ranges(stopped)} failed before it"
        )
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

    def meet(self, fig: RankFigures, ctx: DistContext, terms: Terms | None) -> None:
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
        other = foreign(table, ctx.rank)
        if other is not None:  # another tpload's row: no exchange may follow (its row may not fit)
            self.lost = other
            raise other
        if not failed and terms is not None:  # (not failed: it has its terms)
            decide(table)
            fig.agreed = terms.hex()

    def cannot_meet(self, e: versions.Incompatible) -> None:
        """The ranks run different tploads (versions.py): this rank meets no collective, neither
        this handshake nor the exchange; :meth:`raise_lost` raises ``e``."""
        self.met, self.lost = True, e

    def unmet(self, fig: RankFigures, ctx: DistContext) -> None:
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

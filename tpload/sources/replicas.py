"""Replicas in one launch: each window read from storage once per cluster, sent to the other
replicas, checked on receipt.

With ``replicas`` R the load's group holds R copies of one tp x ep plan: rank ``r`` is replica ``r
// (tp*ep)`` at position ``r % (tp*ep)`` (or where the caller's ``replica_group`` puts it:
:class:`Placement`), and every rank at a position has the same plan, run in the same order. The
plan's runs (loading/loop.py: one item, or a batch of small ones) are split between the position's R
ranks, balanced by bytes (distributed/replica_split.py, the same on every rank); the owner of a run
reads it from storage, as a rank reading alone would, and sends each piece it yields to the
position's other ranks (point-to-point on the wire, distributed/wire.py: NCCL with device tensors on
GPUs whose group has it, gloo with host tensors otherwise; the same calls and the same code either
way), which place it in their arena exactly where the read would have put it.

The transport is not trusted. The owner fingerprints every window it sends from the very bytes it
read (and hashed, or had its node peer hash: verification/node.py), with the loop's fingerprint
(kernels/fingerprint.py), and sends the value after the window's last piece; the receiver
fingerprints what it received and compares. A difference is a problem of the receiver's load, naming
the tensor, the sender and the receiver; it fails every rank in the one exchange. Receivers never
hash a window they received: the hash plan (verification/node.py) is made over the windows each
rank reads from storage itself (:meth:`Link.reads`), so every stored byte is hashed once per node
that reads it, not once per replica.

:class:`ReplicaSource` is the read source (sources/base.py) the loop reads through: it wraps this
rank's storage source, and its :class:`Link` does the traffic. What it counts: window bytes, read
from storage or received (a batch counts the windows in its span, not the span: docs/format.md).

Bounded: sends go through a ring of :data:`RING` buffers of the reader's chunk size (a send buffer
is reused only when its sends completed), receives through a ring of the same size (on a device
wire, each with its device buffer beside it); every wait has the load's timeout and fails naming
the peer (how a dead peer is bounded on gloo and on NCCL: distributed/wire.py).
"""

from __future__ import annotations

import contextlib
import datetime
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from ..distributed.exchange import Flags
from ..distributed.placement import RING, Placement
from ..distributed.replica_split import Position
from ..distributed.wire import Wire
from ..distributed.world import DistContext
from ..kernels.fingerprint import HostFingerprint
from ..model.errors import LoadError, StoodDown
from ..model.text import escape_name
from ..model.values import DIGEST_BYTES, Box, Stored, Triple
from ..storage.reader import CHUNK_BYTES, Tap
from ..verification.node import fold, xor_fold
from .base import Piece, SourceFigures, Span
from .storage import StorageSource

if TYPE_CHECKING:  # the plans read and the exchanged rows a verdict reads (annotations only)
    from ..model.figures import RankFigures
    from ..planning.planner import RankPlan

PIECE, END, ABORT, BYE = 1, 2, 3, 4
"""A header's kinds: a piece of a window, the window's end (its fingerprint), and the two ends of a
stream (every message a rank sends to one peer in a load): BYE after its last window, or ABORT
where its loop stopped (the call's sequence number, the reason and the rank that failed beside the
tag), so the ranks waiting for the rest stop at once rather than after --timeout. Every stream ends
with exactly one of them and every rank reads each stream to it (a rank that stops reads on and
drops what comes: :meth:`Link.abort`), so no send is ever left unmatched in the group."""
READING, FAILED, STOPPED = 1, 2, 3
"""An ABORT's reasons: the sender failed while reading the window, the sender failed (elsewhere),
the sender stopped because another rank (named in the header) failed."""
CHECK_S = 0.05
"""How often a sender looks in the rendezvous store for a receiver that stopped (a store round trip
a look; between pieces only)."""
HEADER_WORDS = (
    8  # kind, name tag, first row, first column, rows, columns (or the fingerprint's 3 words)
)


def send(tensor: torch.Tensor, group_dst: int, group: dist.ProcessGroup) -> dist.Work:
    """Send ``tensor`` to ``group_dst`` (asynchronous); a module function, so a test can wrap it."""
    return dist.isend(tensor, group=group, group_dst=group_dst)


def recv(tensor: torch.Tensor, group_src: int, group: dist.ProcessGroup) -> dist.Work:
    return dist.irecv(tensor, group=group, group_src=group_src)


def _tag(name: str) -> int:
    return zlib.crc32(name.encode())


class Link:
    """This rank's share of the replicas' traffic for one load."""

    def __init__(
        self,
        ctx: DistContext,
        at: Placement,
        shared: Sequence[Position],
        timeout_s: float,
        seq: int,
        wire: Wire | None = None,
    ) -> None:
        """``shared``: the split of positions 0 to this rank's position at least (those of the
        plans :meth:`reads` is asked about too); ``seq``: the load() call (an abort names it);
        ``wire``: where the messages go (default: the load's, distributed/wire.py)."""
        self.ctx, self.at, self.timeout_s, self.seq = ctx, at, timeout_s, seq
        self.replicas = replicas = at.replicas
        self.size = at.size
        self.replica, self.position = at.where(ctx.rank)
        self.wire = Wire.of(ctx) if wire is None else wire
        self.others = [at.rank(q, self.position) for q in range(replicas) if q != self.replica]
        self.split = shared
        mine = self.split[self.position]
        self.by_name, self.by_batch = mine.by_name, mine.by_batch
        self.problems: list[str] = []
        self._sent: list[tuple[str, Box, Triple]] = []
        self._seen: dict[int, list[tuple[str, Box, Triple]]] = {}
        self.from_storage = self.from_peers = 0
        self._owning: str | None = None
        """The window this rank is reading and sending now (its END not shipped yet)."""
        # the rings: host buffers (the loop and the fingerprint read them) and, beside each, its
        # wire buffer (the same memory on the CPU: distributed/wire.py)
        self._send: list[np.ndarray] = [np.empty(0, np.uint8)] * RING
        self._send_wire = [torch.empty(0, dtype=torch.uint8)] * RING
        # each ring slot's works, and the header tensors they send (kept alive until waited for)
        self._works: list[list[dist.Work | torch.Tensor]] = [[] for _ in range(RING)]
        self._recv: list[np.ndarray] = [np.empty(0, np.uint8)] * RING
        self._recv_wire = [torch.empty(0, dtype=torch.uint8)] * RING
        self._turn = self._rturn = 0
        # the streams' ends (see BYE): to whom this rank sent its end, whose end it read, whose
        # stream it can no longer read (a wait failed), and the receives it posted ahead and has
        # not waited for (a window the loop stopped in the middle of: the drain waits for them)
        self._ended_out: set[int] = set()
        self._ended_in: set[int] = set()
        self._broken: set[int] = set()
        self._inflight: dict[int, tuple[list[dist.Work], torch.Tensor]] = {}
        self._stopped_by: int | None = None
        """The rank whose failure stopped this one (None: nothing stopped it, or it failed)."""
        self.flags = Flags(ctx, seq, "replicas-stopped") if ctx.group is not None else None
        self._looked = 0.0

    def reads(self, plans: Mapping[int, RankPlan]) -> dict[int, Mapping[str, Box]]:
        """Each plan's windows its rank reads from storage itself (the hash plan's input)."""
        out: dict[int, Mapping[str, Box]] = {}
        for p, plan in plans.items():
            q, position = self.at.where(p)
            own = self.split[position].reads[q]
            out[p] = {n: box for n, box in plan.reads.items() if n in own}
        return out

    def mine(self, name: str) -> bool:
        return self.by_name.get(name, self.replica) == self.replica

    def source(self, name: str) -> str:
        """Where this rank's window of ``name`` came from, in words ("" when read from storage)."""
        if self.mine(name):
            return ""
        owner = self.by_name[name]
        return f" (received from rank {self.at.rank(owner, self.position)}, replica {owner})"

    # -- sending -----------------------------------------------------------------------------------

    def _wait(self, works: Iterable[dist.Work], what: str) -> None:
        for work in works:
            try:
                ok = work.wait(datetime.timedelta(seconds=self.timeout_s))
            except (
                RuntimeError,
                TimeoutError,
                OSError,
            ) as e:  # a dead or hung peer (gloo: DistBackendError)
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise LoadError(f"replicas: {what}: {escape_name(first)[:300]}") from None
            if ok is False:
                raise LoadError(f"replicas: {what}: no answer within {self.timeout_s:g} s")

    def _ship(self, header: list[int], data: torch.Tensor | None, i: int | None) -> None:
        h = self.wire.header(header + [0] * (HEADER_WORDS - len(header)))
        works = self._works[i if i is not None else self._turn]
        group = self.wire.group
        # every rank of a position runs the same plan in the same order, so each pair of ranks
        # posts its sends and receives in one order on both sides: NCCL's point-to-point calls
        # (which block until matched) cannot wait on each other in a cycle
        for t in self.others:
            works.append(send(h, t, group))
            if data is not None:
                works.append(send(data, t, group))
        works.append(h)  # kept alive until its sends are done

    def _buffer(self, nbytes: int, name: str) -> int:
        i = self._turn = (self._turn + 1) % RING
        works = self._works[i]
        self._wait(
            [w for w in works if not isinstance(w, torch.Tensor)],
            f"rank {self.ctx.rank} sending {escape_name(name)} to rank(s) "
            f"{', '.join(map(str, self.others))}",
        )
        works.clear()
        if self._send[i].size < nbytes:
            self._send[i] = self.wire.host(nbytes)
            self._send_wire[i] = self.wire.buffer(self._send[i])
        return i

    def sending(
        self, name: str, box: Box, pieces: Iterable[Piece], *, count: bool = True
    ) -> Iterator[Piece]:
        """Pass ``pieces`` (a window of ``width`` bytes a row, read from storage) on, sending each
        to the other replicas first, then the window's fingerprint, taken from the bytes read."""
        fp, tag = HostFingerprint(box[1][1] - box[1][0]), _tag(name)
        self._owning = name
        for r, c, view in pieces:
            self._look(name)
            h, w = view.shape
            i = self._buffer(h * w, name)
            data = self._send[i][: h * w]
            fp.add(view, r, dst=data.reshape(h, w), first_col=c)
            self._ship([PIECE, tag, r, c, h, w], self.wire.put(data, self._send_wire[i]), i)
            if count:  # a window's bytes (a batch's span counts its windows: read_run)
                self.from_storage += h * w
            yield r, c, view
        self._ship([END, tag, *fp.value()], None, None)
        self._owning = None
        self._sent.append((name, box, fp.value()))

    def _look(self, name: str) -> None:
        """Between pieces: a receiver that stopped (it left a flag in the rendezvous store) drains
        what it is sent without using it, so stop sending: end the stream with an ABORT naming the
        rank that failed, and stop (errors.StoodDown: that rank's own message is the cause)."""
        now = time.monotonic()
        if self.flags is None or now - self._looked < CHECK_S:
            return
        self._looked = now
        stopped = self.flags.first(self.others)
        if stopped is None:
            return
        origin = int(stopped[1]) if stopped[1].isdigit() else stopped[0]
        self._stopped_by = origin
        self._end(ABORT, STOPPED, _tag(name), origin)
        raise StoodDown(
            f"replicas: stopped sending {escape_name(name)} to rank(s) "
            f"{', '.join(map(str, self.others))}: rank {origin} failed"
        )

    def _end(
        self, kind: int, reason: int, tag: int, origin: int, to: list[int] | None = None
    ) -> None:
        """End this rank's stream to ``to`` (default: every other rank of its position not yet
        ended) with a BYE or an ABORT (its reason and the rank that failed)."""
        for t in [t for t in (self.others if to is None else to) if t not in self._ended_out]:
            h = self.wire.header([kind, tag, self.seq, reason, origin] + [0] * (HEADER_WORDS - 5))
            self._works[self._turn] += [send(h, t, self.wire.group), h]
            self._ended_out.add(t)

    def abort(self) -> None:
        """This rank's loop stopped (it failed, or a peer's failure stopped it). It says so in the
        rendezvous store (a peer sending to it stops: :meth:`_look`), ends its streams with an
        ABORT (a peer waiting for its next piece or window stops at once), then reads every stream
        sent to it to its end, dropping what comes, so every send of the load is matched and its
        peers' sends complete. Never raises: this rank's own failure is what it reports; bounded
        by the load's timeout as a whole."""
        deadline = time.monotonic() + self.timeout_s
        me, origin = self.ctx.rank, self._stopped_by
        name, self._owning = self._owning, None
        reason = STOPPED if origin is not None else READING if name is not None else FAILED
        if self.flags is not None:
            self.flags.put(me, str(origin if origin is not None else me))
        # a peer already gone learns of the failure from the exchange
        with contextlib.suppress(RuntimeError, OSError, ValueError, LoadError):
            self._end(ABORT, reason, _tag(name or ""), origin if origin is not None else me)
        for t in self.others:
            self._drain(t, deadline)
        for works in self._works:  # the ends sent: matched by the peers' reads of them
            with contextlib.suppress(RuntimeError, OSError, ValueError, TimeoutError):
                for w in works:
                    if not isinstance(w, torch.Tensor):
                        w.wait(datetime.timedelta(seconds=max(0.1, deadline - time.monotonic())))
            works.clear()

    def _drain(self, src: int, deadline: float) -> None:
        """Read ``src``'s stream to its end (BYE or ABORT), dropping what comes (never raises)."""
        group = self.wire.group
        while src not in self._ended_in and src not in self._broken:
            left = datetime.timedelta(seconds=max(0.1, deadline - time.monotonic()))
            try:
                if src in self._inflight:  # the receives the loop left posted: the next header
                    works, header = self._inflight.pop(src)
                else:
                    header = self.wire.header(size=HEADER_WORDS)
                    works = [recv(header, src, group)]
                for w in works:
                    w.wait(left)
                head = header.tolist()
                if head[0] == PIECE:
                    n = head[4] * head[5]
                    i = self._rturn = (self._rturn + 1) % RING
                    if self._recv[i].size < n:
                        self._recv[i] = self.wire.host(n)
                        self._recv_wire[i] = self.wire.buffer(self._recv[i])
                    recv(self._recv_wire[i][:n], src, group).wait(left)
                elif head[0] != END:  # its end (or a stream out of step: stop reading it)
                    self._ended_in.add(src)
            except (RuntimeError, OSError, ValueError, TimeoutError):  # a peer dead or hung
                self._broken.add(src)

    def finish(self) -> tuple[str, str]:
        """Wait for every send still under way (before the exchange), end each stream with a BYE
        and read each peer's end; the exchange's own check, apart from the values sent with the
        bytes: what this rank sent, and what it received from each sender, folded
        (verification/node.py's fold) and XOR-ed over its senders (hex)."""
        for works in self._works:
            self._wait(
                [w for w in works if not isinstance(w, torch.Tensor)],
                f"rank {self.ctx.rank} sending to rank(s) {', '.join(map(str, self.others))}",
            )
            works.clear()
        # each pair in one order on both sides (the lower rank sends first): NCCL's point-to-point
        # calls block until matched, and a send and a receive of one pair cannot wait on each other
        for t in sorted(self.others):
            if self.ctx.rank < t:
                self._end(BYE, 0, 0, 0, [t])
            self._end_of(t)
            self._end(BYE, 0, 0, 0, [t])
        for works in self._works:
            self._wait(
                [w for w in works if not isinstance(w, torch.Tensor)],
                f"rank {self.ctx.rank} ending its streams to rank(s) "
                f"{', '.join(map(str, self.others))}",
            )
            works.clear()
        sent = fold(self._sent).hex()
        seen = xor_fold([fold(lines) for lines in self._seen.values()]).hex()
        return sent, seen

    def _end_of(self, src: int) -> None:
        """Read ``src``'s end: a BYE, or an ABORT (errors.StoodDown, naming why)."""
        q = self.at.where(src)[0]
        what = f"rank {self.ctx.rank} reading the end of rank {src}'s stream (replica {q})"
        header = self.wire.header(size=HEADER_WORDS)
        try:
            self._wait([recv(header, src, self.wire.group)], what)
        except LoadError:
            self._broken.add(src)
            raise
        head = header.tolist()
        if head[0] == BYE:
            self._ended_in.add(src)
            return
        self._header(
            header, -1, what, f"stopped at the end of rank {src}'s stream (replica {q}), which", src
        )

    # -- receiving ---------------------------------------------------------------------------------

    def receiving(self, name: str, box: Box, owner: int, *, count: bool = True) -> Iterator[Piece]:
        """The window ``name`` as the rank of replica ``owner`` at this position read it, piece by
        piece; its fingerprint compared with the sender's at the end (a difference: a problem).
        Receive-ahead: the next piece's bytes (and the header after them) are asked for before this
        piece goes to the loop, so its copy overlaps their transfer (messages from one sender are
        matched in the order they are asked for)."""
        src = self.at.rank(owner, self.position)
        what = (
            f"rank {self.ctx.rank} receiving {escape_name(name)} from rank {src} (replica {owner})"
        )
        fp, tag = HostFingerprint(box[1][1] - box[1][0]), _tag(name)
        headers = [self.wire.header(size=HEADER_WORDS) for _ in range(2)]
        group = self.wire.group
        k = 0
        self._receive([recv(headers[k], src, group)], what, src)
        who = f"stopped receiving {escape_name(name)} from rank {src} (replica {owner}), which"
        head = self._header(headers[k], tag, what, who, src)
        ready = None
        while True:
            posted = None
            if head[0] == PIECE:
                r, c, h, w = head[2:6]
                i = self._rturn = (self._rturn + 1) % RING
                if self._recv[i].size < h * w:
                    self._recv[i] = self.wire.host(h * w)
                    self._recv_wire[i] = self.wire.buffer(self._recv[i])
                data, wire = self._recv[i][: h * w], self._recv_wire[i][: h * w]
                got = recv(wire, src, group)
                k ^= 1
                works = [got, recv(headers[k], src, group)]
                posted = (r, c, data.reshape(h, w), data, wire, works)
                self._inflight[src] = (works, headers[k])  # until waited for: see _drain
            if ready is not None:
                yield ready
            if posted is None:  # the window's end: its fingerprint as the sender took it
                want = tuple(head[2:5])
                self._seen.setdefault(owner, []).append((name, box, fp.value()))
                if fp.value() != want:  # with --verify digest too: it names the tensor
                    self.problems.append(
                        f"tensor {escape_name(name)}: the bytes rank {self.ctx.rank} received "
                        f"from rank {src} (replica {owner}) differ from those rank {src} read "
                        "from storage (fingerprint "
                        f"{list(fp.value())} != {list(want)}): changed in transit"
                    )
                return
            r, c, view, data, wire, works = posted
            del self._inflight[src]
            self._receive(works, what, src)
            self.wire.take(wire, data)  # a device wire's bytes into the host piece
            head = self._header(headers[k], tag, what, who, src)
            fp.add(view, r, first_col=c)
            if count:
                self.from_peers += view.size
            ready = r, c, view

    def _receive(self, works: list[dist.Work], what: str, src: int) -> None:
        """Wait for receives from ``src``; a failed wait leaves its stream unreadable (no drain)."""
        try:
            self._wait(works, what)
        except LoadError:
            self._broken.add(src)
            raise

    def _header(self, header: torch.Tensor, tag: int, what: str, who: str, src: int) -> list[int]:
        """A header received from ``src`` where a piece or a window's end of ``tag`` is due: an
        ABORT of this call stops this rank (errors.StoodDown: ``who`` and why; the rank that failed
        has its own message), a BYE or another tensor's header is out of step."""
        head: list[int] = header.tolist()
        if head[0] in (ABORT, BYE):
            self._ended_in.add(src)
        if head[0] == ABORT and head[2] == self.seq:
            self._stopped_by = origin = head[4]
            why = {READING: "failed while reading it", FAILED: "failed"}.get(
                head[3], f"stopped when rank {origin} failed"
            )
            raise StoodDown(f"replicas: {who} {why}")
        if head[1] != tag or head[0] not in (PIECE, END):
            raise LoadError(
                f"replicas: {what}: the stream is out of step (got a piece of another tensor); "
                "the ranks of a position must load the same plan"
            )
        return head

    # -- the two places the loop reads storage -----------------------------------------------

    def read_run(
        self, inner: StorageSource, span: Stored, out: np.ndarray, window_bytes: int
    ) -> None:
        """A batch's one read (loading/batch.py): from storage by its owner, then sent; received by
        the others. Counted as its windows' bytes (``window_bytes``), not the span's: a span holds
        whole small tensors, of which a tp rank serves a window."""
        owner = self.by_batch.get((str(span.path), span.offset))
        if owner is None:
            raise LoadError(
                f"replicas: {escape_name(span.name)}: a read outside the plan the replicas share"
            )
        flat = out.reshape(1, -1)
        n = flat.shape[1]
        if owner == self.replica:
            self._owning = span.name  # the receivers wait for it from here: see abort()
            inner.read_run(span, out, window_bytes=window_bytes)
            step = CHUNK_BYTES
            pieces = ((0, c, flat[:, c : c + step]) for c in range(0, n, step))
            for _ in self.sending(span.name, ((0, 1), (0, n)), pieces, count=False):
                pass
            self.from_storage += window_bytes
            return
        for r, c, view in self.receiving(span.name, ((0, 1), (0, n)), owner, count=False):
            flat[r : r + view.shape[0], c : c + view.shape[1]] = view
        self.from_peers += window_bytes


class ReplicaSource:
    """The read source of a load with replicas: a window this replica reads comes from this rank's
    storage source (and is sent); any other, from the replica that reads it."""

    own_order = False
    """A window goes to the other replicas as it is read, and each receives in its plan's reading
    order: every rank keeps that order (sources/order.py's turns would differ between a reader's
    node and a receiver's)."""

    def __init__(self, inner: StorageSource, link: Link) -> None:
        self.inner, self.link = inner, link

    def box(self, name: str, view: Span, rows: Span, cols: Span) -> tuple[Stored, Span, Span]:
        return self.inner.box(name, view, rows, cols)

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`box` of many names at once as columns (file id, first byte, byte count), when
        the storage keeps them (planning/batches.py's ``spans_of``); None: ask ``box``."""
        return self.inner.spans(names)

    def promised(self, names: Sequence[str]) -> list[str | None] | None:
        """What :meth:`stored` says each name's bytes must hash to, for many names at once, when
        the storage has them as columns; None: ask ``stored``."""
        return self.inner.promised(names)

    def stored(self, name: str) -> Stored:
        return self.inner.stored(name)

    def start(self, chunk_bytes: int) -> None:
        self.inner.start(chunk_bytes)

    def blocks(
        self,
        stored: Stored,
        rows: Span,
        cols: Span,
        *,
        tap: Tap | None = None,
        row_multiple: int = 1,
        split_rows: bool = True,
    ) -> Iterator[Piece]:
        link, box = self.link, (rows, cols)
        if link.mine(stored.name):
            yield from link.sending(
                stored.name,
                box,
                self.inner.blocks(
                    stored, rows, cols, tap=tap, row_multiple=row_multiple, split_rows=split_rows
                ),
            )
            return
        if tap is not None:  # the hash plan is made over each rank's own reads: this cannot happen
            raise LoadError(
                f"replicas: {escape_name(stored.name)} is hashed by a rank that does not read it"
            )
        yield from link.receiving(stored.name, box, link.by_name[stored.name])

    def read_run(self, span: Stored, out: np.ndarray, *, window_bytes: int) -> None:
        self.link.read_run(self.inner, span, out, window_bytes)

    def will_need(self, stored: Stored) -> None:
        if self.link.mine(
            stored.name
        ):  # a window another replica reads is not worth this node's readahead
            self.inner.will_need(stored)

    def storage_reads(self, plans: Mapping[int, RankPlan]) -> dict[int, Mapping[str, Box]]:
        return self.link.reads(plans)

    def source(self, name: str) -> str:
        return self.link.source(name)

    def finish(self) -> SourceFigures:
        own = self.inner.finish()
        sent, seen = self.link.finish()
        link = self.link
        return SourceFigures(
            link.from_storage, link.from_peers, sent, seen, own.problems + tuple(link.problems)
        )

    def abort(self) -> None:
        self.link.abort()

    def verdict(self, rows: Sequence[RankFigures]) -> list[str]:
        return verdict(rows, self.link.at)


def verdict(ranks: Sequence[RankFigures], at: Placement | int | None) -> list[str]:
    """From the exchanged table: every receiver whose folded sightings differ from what the ranks at
    its position sent (the per-window check on receipt names the tensor; this one does not trust the
    values that travelled with the bytes). ``at``: where each rank stands (an int R: in rank order).
    """
    if isinstance(at, int):
        at = Placement.in_order(at, len(ranks) // at) if at > 1 else None
    if at is None or at.replicas <= 1:
        return []
    out = []
    for t in ranks:
        q, p = at.where(t.rank)
        senders = [at.rank(s, p) for s in range(at.replicas) if s != q]
        want = xor_fold(
            bytes.fromhex(ranks[s].replicas_sent) if ranks[s].replicas_sent else bytes(DIGEST_BYTES)
            for s in senders
        )
        got = bytes.fromhex(t.replicas_seen) if t.replicas_seen else bytes(DIGEST_BYTES)
        if want != got:
            out.append(
                f"rank {t.rank} (replica {q}) holds windows from rank(s) "
                f"{', '.join(map(str, senders))} that differ from what they read from storage and "
                "sent (the exchange's check of the transfers)"
            )
    return out

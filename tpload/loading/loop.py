"""Run one rank's plan: each tensor's window, read once, checked, onto the device, into its slot.

The per-tensor sequence, and nothing else:

1. the read source (sources/: the storage, or the replica peers) streams the
   stored rows holding the window through a private staging buffer, feeding the
   whole tensor to a sha256 tap when this rank hashes it (sources/hashing.py);
2. the codec's checker looks at each block's host bytes (bad scale bytes, NaN
   codes, decodes that would overflow bf16) (codecs/);
3. the transfer copies the block into its slot, fingerprinting it in the same
   pass (transfer/); a decoded kind stages the block and the codec decodes it
   into the slot instead;
4. the served tensor's fingerprint, what it must equal and the counts go to
   the evidence (verification/evidence.py), judged once at the end in one
   device-to-host transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from ..codecs.base import Cut, Problem, decode_rows
from ..kernels.fingerprint import (
    HostFingerprint,
    as_bytes2d,
    count_nonfinite,
    decoded_fingerprint,
    fingerprint,
)
from ..model.errors import LoadError
from ..model.progress import BatchSink, ProgressSink
from ..planning.batches import BATCH_BYTES, PlanRuns
from ..planning.items import Item, Output
from ..planning.planner import RankPlan
from ..sources.base import ReadSource, SourceFigures
from ..sources.hashing import Hasher
from ..storage.pagecache import ShardRelease
from ..transfer.base import Transfer
from ..verification.evidence import Check, Evidence
from .batch import Batch, BatchWindows, box_columns
from .result import Arena, LoadResult

READAHEAD_ITEMS = 2  # how many items ahead the kernel is asked to read (a cold page cache)
READAHEAD_FROM = (
    256 << 10
)  # smaller items are not worth a system call: the kernel's own readahead has them
NOT_FINITE = "decode(s) not finite everywhere (it overflows bf16, or decodes a bad code)"


def nonfinite_problem(window: np.ndarray | torch.Tensor, dtype: str) -> tuple[int, str]:
    """(how many, what) of the NaN and inf in a window the fingerprint pass flagged: counted
    exactly, on this rare path only."""
    raw = window if isinstance(window, np.ndarray) else window.cpu().numpy()
    found = count_nonfinite(np.ascontiguousarray(raw).reshape(-1), dtype)
    if found is None or found[0] == 0:  # the flag alone refuses: a zero count would pass silently
        return 1, (
            "non-finite value(s) (NaN or inf: flagged by the fingerprint pass, though the exact "
            "count found none; a refresh takes them only with allow_nonfinite)"
        )
    count, first = found
    return count, (
        f"non-finite value(s) (NaN or inf; the first at element {first:,}; a refresh takes them "
        "only with allow_nonfinite)"
    )


SAMPLE_ROWS = 32  # rows checked at each end of a sampled decode (at least one scale block)


def _sample_spans(n: int, multiple: int) -> list[tuple[int, int]]:
    """The first rows and the last rows of ``n`` (each at least one scale block, starting on
    one)."""
    k = max(SAMPLE_ROWS, multiple)
    head = (0, min(k, n))
    start = max(head[1], (n - k) // multiple * multiple)
    return [head] + ([(start, n)] if start < n else [])


def _sampled(plan: RankPlan, per_codec: int) -> set[str]:
    """The decoded items checked against an independent decode: ``per_codec`` of each codec's,
    spread evenly (first and last included). Whether a class decodes, and by which codec, is
    asked of its first item (the others are cut alike)."""
    if plan.kind != "expanded" or per_codec <= 0:
        return set()
    decoded: dict[int, str] = {}
    _, first = np.unique(plan.klass, return_index=True)
    for t in first.tolist():
        item = plan.item(t)
        if not item.codec.copies(item.fit, plan.kind):
            decoded[int(plan.klass[t])] = item.codec.name
    by_codec: dict[str, list[str]] = {}
    if decoded:
        names, klass = plan.names, plan.klass
        for t in np.flatnonzero(np.isin(klass, list(decoded))).tolist():
            by_codec.setdefault(decoded[int(klass[t])], []).append(names[t])
    picks = set()
    for names_of in by_codec.values():
        n = len(names_of)
        picks |= {
            names_of[round(j * (n - 1) / max(per_codec - 1, 1))] for j in range(min(per_codec, n))
        }
    return picks


class _Loader:
    """One rank's loop state: the read source, transfer, hasher and evidence it shares across
    items."""

    def __init__(
        self,
        source: ReadSource,
        plan: RankPlan,
        transfer: Transfer,
        hasher: Hasher,
        release: ShardRelease | None,
        finite: bool = False,
    ) -> None:
        self.source, self.plan, self.transfer, self.hasher, self.release = (
            source,
            plan,
            transfer,
            hasher,
            release,
        )
        self.finite = finite
        """Refuse NaN and inf in the windows of floating tensors served as stored (a refresh's
        rule), looked for in the pass that copies and fingerprints them."""
        source.start(transfer.chunk_bytes)
        self.evidence = Evidence()
        self.arena = Arena(transfer.arena(plan.arena_bytes), host=transfer.host_slots)
        self.sampled = 0
        self._batch_buffer: np.ndarray | None = None
        self._checked_by_class: np.ndarray | None = None
        self._formats: np.ndarray | None = None

    def _blocks(
        self, cut: Cut, *, row_multiple: int = 1, split_rows: bool = True
    ) -> tuple[str, Iterator[tuple[int, int, np.ndarray]]]:
        """(where the cut's bytes are, the blocks of its window): the tensor goes to the hasher
        whole on its first read, when this rank hashes it."""
        stored, rows, cols = self.source.box(cut.name, cut.view, cut.rows, cut.cols)
        return stored.path.name, self.source.blocks(
            stored,
            rows,
            cols,
            tap=self.hasher.tap(stored),
            row_multiple=row_multiple,
            split_rows=split_rows,
        )

    def copy(self, item: Item) -> None:
        """Stored bytes served as they are (packed kind; plain tensors): each cut into its slot."""
        checker = item.codec.checker(item.fit, item.weight, item.scale)
        checks = {}
        for cut in item.cuts:
            out = item.output(cut.name)
            dst = self.arena.bytes2d(out, cut.rows[1] - cut.rows[0])
            feed = item.value_feed(checker, cut)
            # the served tensor's fingerprint, in its own view; the window's, in the cut's (the node
            # cross-check compares it with the hasher's): the same when the views are (group 1)
            # (a piece narrower than the served row's words cannot be grouped: then compare in the
            # cut's view)
            fp = HostFingerprint(
                cut.row_bytes,
                group=cut.group if HostFingerprint.fits(cut.row_bytes, cut.group) else 1,
                finite=cut.dtype if self.finite else "",
            )
            window = fp if fp.group == 1 else HostFingerprint(cut.row_bytes)
            # the value checkers read whole rows (a scale group never straddles a piece); plain rows
            # may split
            where, blocks = self._blocks(cut, split_rows=not item.codec.checked and cut.group == 1)
            for r, c, view in blocks:
                feed(view, r)
                self.transfer.copy(
                    view, dst[r : r + view.shape[0], c : c + view.shape[1]], fp, r, c
                )
                if window is not fp:
                    window.add(view, r, first_col=c)
            mine = (
                dst if cut.group == 1 else dst.reshape(dst.shape[0] // cut.group, -1)
            )  # the served tensor's view
            served, want = self.transfer.served(mine if fp.group == cut.group else dst, fp)
            digest = None if fp.group == cut.group else fingerprint(torch.as_tensor(mine))
            self.evidence.window(cut.name, cut.box, window.value())
            checks[cut.name] = Check(out.name, where, served, want, "host window", digest=digest)
            if fp.nonfinite:
                checks[cut.name].bad.append(nonfinite_problem(dst, cut.dtype))
        if item.codec.checked:
            self._problems(item, checker.problems(), checks)
        for check in checks.values():
            self.evidence.add(check)

    def _gather(self, cut: Cut, feed: Callable[[np.ndarray, int], None]) -> np.ndarray:
        """A scale window read whole into host memory (fed to its value check, fingerprinted)."""
        host: np.ndarray = np.empty((cut.rows[1] - cut.rows[0], cut.row_bytes), dtype=np.uint8)
        fp = HostFingerprint(cut.row_bytes)
        _, blocks = self._blocks(cut, split_rows=False)
        for r, _, view in blocks:
            feed(view, r)
            fp.add(view, r, dst=host[r : r + view.shape[0]])
        self.evidence.window(cut.name, cut.box, fp.value())
        return host

    def decode(self, item: Item, sampled: bool) -> None:
        """A decoded kind: the scale windows gathered whole, then the weight decoded block by
        block."""
        codec, fit = item.codec, item.fit
        checker = codec.checker(fit, item.weight, item.scale)
        scale_host = scale = scale2 = None
        for cut in item.scales:
            host = self._gather(cut, item.value_feed(checker, cut))
            if cut is item.scale:
                scale_host, scale = host, self.transfer.upload(host)
            else:
                scale2 = (
                    host  # a global scale: its value shapes the decode table, built on the host
                )
        out = item.outputs[0]
        slot = self.arena.tensor(out)
        rows = slot.reshape(item.weight.rows[1] - item.weight.rows[0], -1)
        unfold = item.weight.row_bytes // codec.decode_row_bytes(
            fit, item.weight
        )  # decode rows per view row
        fp = HostFingerprint(item.weight.row_bytes)
        spans = _sample_spans(rows.shape[0], codec.row_multiple(fit)) if sampled else []
        kept: dict[int, np.ndarray] = {}
        where, blocks = self._blocks(
            item.weight, row_multiple=codec.row_multiple(fit), split_rows=False
        )
        for r, _, view in blocks:
            checker.weight(view, r)
            staged = self.transfer.stage(view, fp, r, 0)
            n = view.shape[0]
            for a, b in spans:  # keep the sampled rows' stored bytes for the independent decode
                if max(a, r) < min(b, r + n):
                    kept.setdefault(a, np.empty((b - a, view.shape[1]), np.uint8))[
                        max(a, r) - a : min(b, r + n) - a
                    ] = view[max(a, r) - r : min(b, r + n) - r]
            s0, s1 = codec.scale_rows(fit, r, r + n)
            decode_rows(
                codec.decode,
                fit,
                unfold,
                staged,
                scale[s0:s1] if scale is not None else None,
                rows[r : r + n],
                scale2,
            )
        self.evidence.window(item.weight.name, item.weight.box, fp.value())
        served, not_finite = decoded_fingerprint(slot)
        check = Check(out.name, where, served)
        if sampled:
            check.bad.append(
                self._sampled_check(item, rows, spans, kept, scale_host, scale2, unfold)
            )
        check.bad.append((not_finite, NOT_FINITE))
        self._problems(item, checker.problems(), {item.weight.name: check})
        self.evidence.add(check)

    def _sampled_check(
        self,
        item: Item,
        rows: torch.Tensor,
        spans: list[tuple[int, int]],
        kept: dict[int, np.ndarray],
        scale_host: np.ndarray | None,
        scale2: np.ndarray | None,
        unfold: int,
    ) -> tuple[int, str]:
        """The first and last rows of a sampled decode, decoded again by the codec's independent
        reference (numpy) and compared exactly: (1 if they differ, what). Edge rows: where a window
        starts and where a short last scale block ends."""
        codec, fit = item.codec, item.fit
        mine, theirs = HostFingerprint(rows.shape[1] * 2), HostFingerprint(rows.shape[1] * 2)
        for a, b in spans:
            s0, s1 = codec.scale_rows(fit, a, b)
            reference = torch.empty((b - a, rows.shape[1]), dtype=rows.dtype)
            decode_rows(
                codec.reference,
                fit,
                unfold,
                kept[a],
                scale_host[s0:s1] if scale_host is not None else None,
                reference,
                scale2,
            )
            theirs.add(reference.view(torch.uint8).numpy(), a)
            mine.add(as_bytes2d(rows[a:b]).cpu().numpy(), a)
        self.sampled += 1
        return int(mine.value() != theirs.value()), (
            f"decoded rows that differ from an independent decode (rows "
            f"{', '.join(f'{a}..{b - 1}' for a, b in spans)})"
        )

    @staticmethod
    def _problems(item: Item, problems: list[Problem], checks: dict[str, Check]) -> None:
        """Each value problem to the check of the tensor it is about (the weight's when a decode
        serves only the weight)."""
        for count, what, about in problems:
            checks[about if about in checks else item.weight.name].bad.append((count, what))

    def batch(self, runs: PlanRuns, i: int, j: int) -> Batch:
        """Small entries of one file together (batch.py; places ``[i, j)`` of the runs' reading
        order): one read, one pass into their slots, worked on the run's columns (an item is made
        only for a value-checked entry its format's batch-wide check did not clear)."""
        if self._batch_buffer is None:
            self._batch_buffer = np.empty(BATCH_BYTES, dtype=np.uint8)
        plan, order = self.plan, runs.order
        p, q = runs.pieces(i, j)
        label = f"{plan.names[order[i]]} .. {plan.names[order[j - 1]]} ({j - i} tensors)"
        b = Batch(self.source, runs, p, q, label, self._batch_buffer)
        offsets = runs.out[p:q]
        klass = runs.klass[i:j]
        dtypes = None
        if self.finite:  # each piece's stored dtype: the entries' cuts in order
            cuts = runs.classes
            dtypes = [c.dtype for k in klass.tolist() for c in cuts[k].cuts]
        if self.arena.host is not None:  # host slots: written in place
            b.copy(self.arena.host, offsets, dtypes=dtypes)
        else:  # a device: the slots' ranges built on the host, each uploaded at once, checked
            # a batch's entries need not be neighbours in the plan (the arena's order): each range
            # is a run of them with no other entry's slot between (one, in a file-by-file layout)
            entry: np.ndarray = np.repeat(order[i:j], runs.count[i:j])  # each piece's plan entry
            by = np.argsort(entry, kind="stable")
            for ks in np.split(by, np.flatnonzero(np.diff(entry[by]) > 1) + 1):
                self._upload(b, ks, offsets[ks], dtypes)
        evidence, fps = self.evidence, b.fingerprints
        evidence.windows_of(b.names, runs.cut_boxes[p:q], fps)
        self._hash(b)
        checked = self._checked(runs)[klass]
        flagged = _entries_flagged(b.nonfinite, runs, i, j)  # NaN or inf seen (rare)
        if not checked.any() and not flagged.any():  # the common batch: fingerprints in columns
            evidence.served(b.names, fps)
            return b
        dirty = (flagged | (checked & ~self._clean(b, runs, i, j))) if checked.any() else flagged
        if not dirty.any():
            evidence.served(b.names, fps)
            return b
        plain: np.ndarray = np.ones(q - p, bool)  # pieces whose fingerprint is all there is to keep
        dirty_entries: list[int] = (np.flatnonzero(dirty) + i).tolist()
        for t in dirty_entries:  # the value checks, on the batch's bytes
            item = plan.item(int(order[t]))
            k = int(runs.first[t]) - p
            n = int(runs.count[t])
            self._value_checks(b, item, _cut_outputs(item), fps[k : k + n].tolist(), k)
            plain[k : k + n] = False
        if plain.any():
            at = np.flatnonzero(plain)
            evidence.served([b.names[k] for k in at.tolist()], fps[at])
        return b

    def _upload(
        self, b: Batch, ks: np.ndarray, offsets: np.ndarray, dtypes: list[str] | None
    ) -> None:
        """Pieces ``ks`` of a batch (``offsets``: their slots, one range of the arena that holds no
        other entry's) built on the host as one image, uploaded at once, the upload's fingerprint
        checked against the image's."""
        box = b.box[ks]
        sizes = (box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2])  # each slot's bytes
        lo, hi = int(offsets.min()), int((offsets + sizes).max())
        image: np.ndarray = np.zeros(hi - lo, dtype=np.uint8)
        b.copy(image, offsets - lo, ks, dtypes)
        fp = HostFingerprint(hi - lo)
        region = self.arena.buffer[lo:hi].view(1, -1)
        self.transfer.copy(image.reshape(1, -1), region, fp, 0, 0)
        served, want = self.transfer.served(region, fp)
        self.evidence.add(
            Check(
                f"{b.data_label} (arena bytes {lo}..{hi})",
                b.path.name,
                served,
                want,
                "host image",
            )
        )

    def _checked(self, runs: PlanRuns) -> np.ndarray:
        """Per class, whether its items are value-checked (asked of its first item)."""
        if self._checked_by_class is None:
            size = self.plan.class_count
            self._checked_by_class = np.zeros(size, bool)
            for c, cc in runs.classes.items():
                self._checked_by_class[c] = cc.item.codec.checked
        return self._checked_by_class

    def _value_checks(
        self, b: Batch, item: Item, outs: Sequence[Output], triples: list[list[int]], first: int
    ) -> None:
        """A batched item's value checks (scales first) on the batch's bytes, each problem filed on
        the check of the served tensor it is about (``first``: the item's first piece)."""
        checks = {
            cut.name: Check(out.name, b.path.name, tuple(triple), None, "host window")
            for cut, out, triple in zip(item.cuts, outs, triples, strict=True)
        }
        checker = item.codec.checker(item.fit, item.weight, item.scale)
        for j, cut in enumerate(item.cuts, first):
            item.value_feed(checker, cut)(b.view(j), 0)
            if b.nonfinite.size and b.nonfinite[j]:
                checks[cut.name].bad.append(nonfinite_problem(b.view(j), cut.dtype))
        self._problems(item, checker.problems(), checks)
        for check in checks.values():
            self.evidence.add(check)

    def _clean(self, b: Batch, runs: PlanRuns, i: int, j: int) -> np.ndarray:
        """Per place of ``[i, j)``, whether it is a scaled item whose value checks would find
        nothing, decided per format over all of the batch's entries of that format at once
        (Codec.clean, with the fit of the format's first entry in the batch); the others are
        checked one by one."""
        if self._formats is None:  # each class's format (-1: not one scale and a weight)
            size = self.plan.class_count
            self._formats = np.full(size, -1, np.int64)
            keys: dict[tuple[str, str, str], int] = {}
            for c, cc in runs.classes.items():
                item = cc.item
                f = item.fit
                if item.codec.scaled and len(item.scales) == 1 and f.scale is not None:
                    key = (item.codec.name, f.weight.dtype, f.scale.dtype)
                    self._formats[c] = keys.setdefault(key, len(keys))
        klass = runs.klass[i:j]
        formats = self._formats[klass]
        clean: np.ndarray = np.zeros(j - i, bool)
        if formats[0] == formats.min() == formats.max():  # one format (the usual batch)
            first = [0]
        else:  # formats in order of first appearance
            first = np.sort(np.unique(formats, return_index=True)[1]).tolist()
        p = runs.pieces(i, j)[0]
        for at in first:
            if formats[at] < 0:
                continue
            members = np.flatnonzero(formats == formats[at])
            scales = runs.first[members + i] - p  # scale windows first, then
            item = runs.classes[int(klass[at])].item  # the weight's
            if item.codec.clean(item.fit, BatchWindows(b, scales), BatchWindows(b, scales + 1)):
                clean[members] = True
        return clean

    def _hash(self, b: Batch) -> None:
        """The batch's stored tensors this rank hashes, each hashed whole from the batch's bytes,
        with its node peers' windows fingerprinted there (all of them in one pass; a peer's window
        that is this rank's own has its fingerprint already), as columns."""
        want = self.hasher.wanted(b.names)
        if not want.ks:
            return
        ks = want.ks
        k = np.asarray(ks, dtype=np.int64)
        flat: list[int] = []
        if want.at:
            at = k[want.at]  # each peer window's piece
            box = box_columns(want.boxes)
            same = (box == b.box[at]).all(axis=1)  # the peer's window is this rank's own
            fps = b.fingerprints[at]
            if not same.all():
                other = ~same
                fps[other] = b.fingerprint_boxes(at[other], box[other])
            flat = fps.ravel().tolist()
        self.hasher.record_batch(b.stored(ks), b.raws(ks), (want.at, want.ranks, flat))

    def done_batch(self, b: Batch) -> None:
        if self.release is not None:  # each piece's stored tensor, all in the batch's file
            self.release.done(b.path, len(b))

    def done(self, item: Item) -> None:
        if self.release is not None:
            for cut in item.cuts:
                self.release.done(self.source.stored(cut.name).path)


def _cut_outputs(item: Item) -> Sequence[Output]:
    """The served tensor of each cut, in cut order (an item served as stored: one per cut)."""
    if len(item.cuts) == 1:
        return item.outputs
    return [item.output(c.name) for c in item.cuts]


def run(
    source: ReadSource,
    plan: RankPlan,
    *,
    transfer: Transfer,
    hasher: Hasher,
    samples: int,
    progress: ProgressSink,
    release: ShardRelease | None = None,
    ranks: Mapping[str, int] | None = None,
    finite: bool = False,
    turns: Mapping[str, int] | None = None,
) -> LoadResult:
    """Load ``plan`` through ``transfer``, reading every window from ``source`` (sources/: the
    storage, or the replica peers, chosen at setup) and hashing what ``hasher`` says; raise
    LoadError listing every problem of this rank (nothing it loaded survives a failure).
    ``ranks``: each stored name's place in natural order (the catalogue's), for the digest's
    sort. The source's figures are the result's :attr:`~LoadResult.source`. ``finite``: refuse
    NaN and inf in floating windows served as stored (a refresh's rule; a load serves them).
    ``turns``: each stored tensor's turn in this rank's reading (sources/order.py: the tensors it
    leads first); None: the plan's reading order."""
    loader = _Loader(source, plan, transfer, hasher, release, finite)
    try:
        with transfer:  # from the arena's making: its exit waits for what the transfer started
            sampled = _sampled(plan, samples)
            runs = PlanRuns(plan, plan.kind, source)
            order = runs.order.tolist()
            n = len(order)
            read, served = _per_entry(plan, runs.klass)
            # a sink that takes a batch's served tensors in one call (the load's own): asked once
            many = progress.update_many if isinstance(progress, BatchSink) else None
            sequence = in_turns(list(runs), order, plan.names, turns)
            ahead = [order[t] for i, j, _ in sequence for t in range(i, j)]  # entries, as read
            for t in ahead[:READAHEAD_ITEMS]:
                _ask(source, plan, t, hasher)
            at = 0  # the place in ``ahead`` of the run's first entry
            for i, j, batched in sequence:
                at += j - i
                if batched:  # small entries, even one alone: one read, one pass (batch.py)
                    loader.done_batch(loader.batch(runs, i, j))
                    _advance_all(progress, many, read, served, i, j)
                    continue
                item = plan.item(order[i])
                if at - 1 + READAHEAD_ITEMS < n:
                    _ask(source, plan, ahead[at - 1 + READAHEAD_ITEMS], hasher)
                if item.codec.copies(item.fit, plan.kind):
                    loader.copy(item)
                else:
                    loader.decode(item, item.name in sampled)
                loader.done(item)
                _advance(progress, item)
        figures: SourceFigures = source.finish()
        hashed = hasher.finish()
    except BaseException:
        source.abort()  # replicas waiting for a window this rank was sending: stop them
        raise
    finally:
        hasher.close()
        progress.close()
    settled = loader.evidence.settle(hashed, hasher.digests)
    problems = settled.problems + list(figures.problems)
    if problems:
        raise LoadError(f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems))
    return LoadResult(
        loader.arena,
        plan.outputs,
        settled.fingerprints,
        hashed,
        loader.evidence.windows,
        settled.bytes_hashed,
        settled.device_checked,
        loader.sampled,
        ranks,
        figures,
    )


def _entries_flagged(pieces: np.ndarray, runs: PlanRuns, i: int, j: int) -> np.ndarray:
    """Per entry of ``[i, j)``, whether a piece of it was flagged (``pieces``: per piece of the
    batch, nonzero where the copy saw a NaN or inf; empty where it did not look)."""
    if not pieces.size or not pieces.any():
        return np.zeros(j - i, bool)
    owner: np.ndarray = np.repeat(np.arange(j - i), runs.count[i:j])  # each piece's entry
    hit: np.ndarray = np.zeros(j - i, bool)
    hit[owner[pieces != 0]] = True
    return hit


def _advance(progress: ProgressSink, item: Item) -> None:
    """One call per served tensor, as the report's table counts them (a packed weight and its scale
    are two); the item's read bytes go with its first, so bytes add up to the plan's read_bytes."""
    progress.update(item.read_bytes)
    for _ in item.outputs[1:]:
        progress.update(0)


def _per_entry(plan: RankPlan, klass: np.ndarray) -> tuple[list[int], list[int]]:
    """Running sums over the plan's entries in reading order (``klass``: each place's class) of
    their read bytes and served tensors (a packed weight and its scale are two), from their
    classes: a run's are two subtractions."""
    size = plan.class_count
    read: np.ndarray = np.zeros(size, np.int64)
    served: np.ndarray = np.zeros(size, np.int64)
    for c, s in plan.table.items():
        read[c] = s.read_bytes
        served[c] = min(1 + (s.scale is not None) + (s.scale2 is not None), len(s.served))
    zero: np.ndarray = np.zeros(1, np.int64)
    return (
        np.concatenate((zero, np.cumsum(read[klass]))).tolist(),
        np.concatenate((zero, np.cumsum(served[klass]))).tolist(),
    )


def _advance_all(
    progress: ProgressSink,
    many: Callable[[int, int], None] | None,
    read: list[int],
    served: list[int],
    i: int,
    j: int,
) -> None:
    """A batch's served tensors (places ``[i, j)``; ``read``, ``served``: :func:`_per_entry`'s
    sums) in one call with their bytes, when the sink takes one (``many``: the load's own
    ``update_many``); a caller's sink is told of each as :func:`_advance` does."""
    if many is not None:
        many(read[j] - read[i], served[j] - served[i])
        return
    for t in range(i, j):
        progress.update(read[t + 1] - read[t])
        for _ in range(served[t + 1] - served[t] - 1):
            progress.update(0)


def in_turns(
    runs: list[tuple[int, int, bool]],
    order: list[int],
    names: Sequence[str],
    turns: Mapping[str, int] | None,
) -> list[tuple[int, int, bool]]:
    """``runs`` (places ``[i, j)`` of ``order``, the plan's reading order) in the order this rank
    reads them: by the turn of each run's first entry's weight (``names``: each entry's, in plan
    order), the reading order kept within a turn; as they are without ``turns``."""
    if not turns:
        return runs
    get = turns.get
    return sorted(runs, key=lambda run: get(names[order[run[0]]], 0))


def _ask(source: ReadSource, plan: RankPlan, t: int, hasher: Hasher) -> None:
    """Entry ``t``'s stored bytes this rank reads, asked ahead when the entry is large enough to be
    worth it: a tensor this rank hashes whole, of any other the rows that hold its window (a
    column window's are all of them): what the rank will ``pread``, and no byte of its peers'
    rows, which they read themselves."""
    if plan.table[int(plan.klass[t])].read_bytes >= READAHEAD_FROM:
        for cut in plan.item(t).cuts:
            stored, rows, _ = source.box(cut.name, cut.view, cut.rows, cut.cols)
            if not hasher.hashes(stored.name) and rows != (0, stored.rows):
                stored = stored._replace(  # a part: no manifest promise is of these bytes
                    offset=stored.offset + rows[0] * stored.row_bytes,
                    rows=rows[1] - rows[0],
                    sha256=None,
                )
            source.will_need(stored)

"""The evidence a load collects for each served tensor, and the settlement that judges it.

While a rank loads, each served tensor leaves a :class:`Check`: the fingerprint
of what it serves (taken where it lives), what that fingerprint must equal
(the host window's on a GPU; an independent decode for a sample), and counts
of bad values found on the way. Device values stay on the device until
:meth:`Evidence.settle` reads them all in one transfer; then every problem of
the rank is listed at once, with the hash results of its hashing share (sha256, or blake3).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from ..model.columns import RowTable
from ..model.text import escape_name
from ..model.values import Box, Triple
from .hashes import SHA256, Digests, HashResults, mismatches

Count: TypeAlias = int | torch.Tensor
Gathered: TypeAlias = Any
"""A value :func:`_to_host` gathers: a device tensor, or what it is on the host (a number, a
triple, None)."""


@dataclass(slots=True)
class Check:
    """One served tensor's pending evidence."""

    name: str
    """The served tensor."""
    where: str
    """Its file, for messages."""
    served: Triple | torch.Tensor
    """The served tensor's fingerprint (a device tensor until settled)."""
    want: Triple | torch.Tensor | None = None
    """What ``served`` must equal (the host window's); None: nothing to compare (it is the copy's
    own)."""
    want_what: str = ""
    bad: list[tuple[Count, str]] = field(default_factory=list)
    """(count, what) of invalid values: bad scale bytes, NaN codes, overflowing or non-finite
    decodes."""
    digest: Triple | torch.Tensor | None = None
    """The fingerprint in the served tensor's own view, when ``served`` was taken in another (the
    cut's) to compare it with the host window; None: ``served`` is it."""


class WindowTable(RowTable[tuple[Box, Triple]]):
    """Every window a rank read, as columns: names, boxes and an ``[n, 3]`` fingerprint array (a
    name read twice reads as its latest window). The node cross-check reads the columns
    (verification/node.py's ``seen_of``); a (box, fingerprint) is made when one is asked for."""

    def __init__(self, names: list[str], boxes: list[Box], fps: np.ndarray) -> None:
        super().__init__()
        self._row.update(zip(names, range(len(names)), strict=True))
        self._boxes, self._fps = boxes, fps

    @property
    def boxes(self) -> Sequence[Box]:
        return self._boxes

    @property
    def fps(self) -> np.ndarray:
        return self._fps

    def rows(self, names: Iterable[str]) -> list[int]:
        """Each name's row (its latest window); KeyError for a name never read."""
        return list(map(self._row.__getitem__, names))

    def _record(self, name: str, k: int) -> tuple[Box, Triple]:
        a, b, c = self._fps[k].tolist()
        return self._boxes[k], (a, b, c)


class FingerprintTable(RowTable[Triple]):
    """Each served tensor's fingerprint, as columns: names and an ``[n, 3]`` array (a name served
    again reads as its latest); the digest reads the columns (:meth:`columns`), a triple is made
    when one is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self._names: list[str] = []
        self._blocks: list[np.ndarray] = []
        self._single: list[int] = []
        """Three integers a fingerprint added alone, not yet in :attr:`_blocks`."""
        self._fps: np.ndarray | None = None

    def add_block(self, names: list[str], fps: np.ndarray) -> None:
        """Served tensors whose fingerprints are rows of ``fps``, in order."""
        self._flush()
        first = len(self._names)
        self._names += names
        self._blocks.append(np.asarray(fps, np.int64).reshape(-1, 3))
        self._row.update(zip(names, range(first, first + len(names)), strict=True))
        self._fps = None

    def add(self, name: str, fp: Sequence[int]) -> None:
        self._row[name] = len(self._names)
        self._names.append(name)
        self._single.extend(fp)
        self._fps = None

    def _flush(self) -> None:
        if self._single:
            self._blocks.append(np.asarray(self._single, np.int64).reshape(-1, 3))
            self._single = []

    @property
    def fps(self) -> np.ndarray:
        """Every row's fingerprint, ``[n, 3]`` (rows of names served again included)."""
        if self._fps is None:
            self._flush()
            blocks = self._blocks
            self._fps = np.concatenate(blocks) if blocks else np.zeros((0, 3), np.int64)
            self._blocks = [self._fps]
        return self._fps

    def rows(self, names: Iterable[str]) -> list[int]:
        """Each name's row (its latest); KeyError for a name not served."""
        return list(map(self._row.__getitem__, names))

    def _record(self, name: str, k: int) -> Triple:
        a, b, c = self.fps[k].tolist()
        return (a, b, c)


@dataclass
class Settled:
    """A rank's judged evidence."""

    fingerprints: FingerprintTable
    problems: list[str]
    device_checked: int = 0
    hashed: list[str] = field(default_factory=list)
    bytes_hashed: int = 0


class Evidence:
    """Everything one rank collected, in load order; :meth:`settle` judges it.

    A batch of small tensors leaves columns, not a :class:`Check` each: its windows' names, boxes
    and fingerprints (an ``[n, 3]`` array), and the served names whose fingerprint is the copy's own
    (nothing to compare, no value to count): 92,000 tensors a rank, most of them such."""

    def __init__(self) -> None:
        self._log: list[Check | tuple[list[str], np.ndarray]] = []
        """Checks, and blocks of (served names, their fingerprints), in load order."""
        self._windows: list[tuple[list[str], list[Box], np.ndarray | list[Triple]]] = []
        self._window_map: WindowTable | None = None

    def window(self, name: str, box: Box, fp: Triple) -> None:
        """A window read: its box and the fingerprint of its stored bytes (the node cross-check)."""
        self._windows.append(([name], [box], [fp]))
        self._window_map = None

    def windows_of(self, names: list[str], boxes: list[Box], fps: np.ndarray) -> None:
        """Windows read together (a batch's): row ``i`` of ``fps`` is ``names[i]``'s fingerprint."""
        self._windows.append((names, boxes, fps))
        self._window_map = None

    @property
    def windows(self) -> WindowTable:
        """Every window read: (its box, the fingerprint of its stored bytes), by name, as
        columns."""
        if self._window_map is None:
            names: list[str] = []
            boxes: list[Box] = []
            fps: list[np.ndarray] = []
            for block_names, block_boxes, block_fps in self._windows:
                names += block_names
                boxes += block_boxes
                fps.append(np.asarray(block_fps, np.int64).reshape(-1, 3))
            self._window_map = WindowTable(
                names, boxes, np.concatenate(fps) if fps else np.zeros((0, 3), np.int64)
            )
        return self._window_map

    def add(self, check: Check) -> None:
        self._log.append(check)

    def served(self, names: list[str], fps: np.ndarray) -> None:
        """Served tensors whose fingerprints are the copy's own (host slots): row ``i`` of ``fps``
        is ``names[i]``'s."""
        self._log.append((names, fps))

    def settle(self, hashed: HashResults, content: Digests = SHA256) -> Settled:
        checks = [c for c in self._log if isinstance(c, Check)]
        values = _to_host(
            [c.served for c in checks]
            + [c.want for c in checks]
            + [c.digest for c in checks]
            + [n for c in checks for n, _ in c.bad]
        )
        k = len(checks)
        served, wants, digests, counts = (
            iter(values[:k]),
            iter(values[k : 2 * k]),
            iter(values[2 * k : 3 * k]),
            iter(values[3 * k :]),
        )
        out = Settled(FingerprintTable(), [])
        fingerprints, problems, checked = out.fingerprints, out.problems, 0
        for c in self._log:
            if not isinstance(c, Check):
                fingerprints.add_block(*c)
                continue
            fp, want, dig = tuple(next(served)), next(wants), next(digests)
            for (_, what), n in zip(c.bad, counts, strict=False):
                if n:
                    problems.append(f"{_where(c)}: {n} {what} in this rank's window")
            if want is not None:
                if fp != tuple(want):
                    problems.append(
                        f"{_where(c)}: served bytes differ from the {c.want_what} "
                        f"(fingerprint {list(fp)} != {list(want)})"
                    )
                else:
                    checked += 1
            fingerprints.add(c.name, fp if dig is None else tuple(dig))
        out.device_checked = checked
        out.hashed = list(hashed)
        out.bytes_hashed = hashed.nbytes()
        out.problems += mismatches(hashed, content)
        return out


def _where(c: Check) -> str:
    """The served tensor and its file, for a message (made only for a problem: 92,000 checks a
    rank)."""
    return f"tensor {escape_name(c.name)} ({escape_name(c.where)})"


def _to_host(values: list[Gathered]) -> list[Gathered]:
    """Device tensors among ``values`` as Python numbers (a scalar) or tuples, in one transfer per
    device; everything else as it is."""
    if not any(issubclass(t, torch.Tensor) for t in set(map(type, values))):
        return values  # all on the host already (host slots): nothing to gather
    out = list(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
    for idx in by_device.values():
        flat = torch.cat([values[i].reshape(-1).to(torch.int64) for i in idx]).tolist()
        at = 0
        for i in idx:
            n = values[i].numel()
            out[i] = flat[at] if values[i].dim() == 0 else tuple(flat[at : at + n])
            at += n
    return out

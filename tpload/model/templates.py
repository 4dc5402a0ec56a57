"""Natural order: names whose digit runs compare as numbers (``x.2`` before ``x.10``).

The order a rank's digest lists its tensors in (docs/format.md), and the order every listing of a
checkpoint's names uses."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence


def natural_key(
    name: str, run: Callable[[str], tuple[int, str, str]] | None = None
) -> tuple[str | tuple[int, str, str], ...]:
    """Sort key that orders ``x.2`` before ``x.10`` (numbers compared as numbers). Computed per call
    (no cache outlives a sort: a catalogue keeps its names sorted instead,
    :meth:`Catalogue.names`); ``run``: how a digit run's key is made (default :func:`run_key`)."""
    parts = _RUNS(name)  # text, run, text, ..., text: the runs at the odd places
    parts[1::2] = map(run or run_key, parts[1::2])
    return tuple(parts)


def run_key(p: str) -> tuple[int, str, str]:
    """A digit run's place in natural order: (its length without leading zeros, its digits without
    them, its text). Numeric order for any length (int() would refuse 5,000 digits), and "02" after
    "1"; equal values ("2", "02") tie-break on the text."""
    d = p.lstrip("0")
    return len(d), d, p


_RUNS = re.compile(r"(\d+)").split  # re.split with a group alternates text and digit runs


def natural_sorted(names: Iterable[str]) -> list[str]:
    """``sorted(names, key=natural_key)``, faster on a checkpoint's names (:func:`natural_order`).
    Figures: docs/benchmarks.md."""
    names = list(names)
    return [names[i] for i in natural_order(names)]


def natural_order(names: Sequence[str]) -> list[int]:
    """The places of ``names`` sorted by :func:`natural_key`, ties in their given order. Each
    distinct digit run's key is made once for this sort and shared, so equal runs compare by
    identity; the keys go with the sort (no cache outlives it)."""
    runs: dict[str, tuple[int, str, str]] = {}

    def run(p: str) -> tuple[int, str, str]:
        k = runs.get(p)
        if k is None:
            k = runs[p] = run_key(p)
        return k

    keys = [natural_key(name, run) for name in names]
    return sorted(range(len(keys)), key=keys.__getitem__)

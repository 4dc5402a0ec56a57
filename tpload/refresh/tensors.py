"""The trainer's tensors as the loader sees a checkpoint, and the engine's plan cut from them.

A version's tensor table (names, dtypes, shapes) is a catalogue like any checkpoint's, so the
loader's planner classifies and cuts it with the engine's config exactly as a load of a checkpoint
of these weights would; :class:`TensorStorage` serves the tensors' bytes from memory behind the
loader's read source, so each engine rank's digest is computed by the loader's own loop
(attest/predict.py's way), from the bytes that are sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from ..model.errors import LoadError
from ..model.meta import TensorMeta
from ..model.pushed import TensorEntry
from ..model.templates import natural_key
from ..model.text import escape_name
from ..model.values import Box, FileSource, Layout, Stored
from ..planning.planner import Planner, RankPlan
from ..selection.config import Config, load_config
from ..storage.base import StorageBase
from ..storage.catalogue import Catalogue
from .layout import EngineLayout
from .terms import RefreshError

ROOT = Path("/refresh")
"""The catalogue's root: a name for messages, never a folder that is read."""

DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    **{
        d: s
        for a, s in (
            ("float8_e4m3fn", "F8_E4M3"),
            ("float8_e5m2", "F8_E5M2"),
            ("float8_e8m0fnu", "F8_E8M0"),
            ("uint16", "U16"),
            ("uint32", "U32"),
            ("uint64", "U64"),
        )
        if (d := getattr(torch, a, None)) is not None
    },
}


def entry_of(name: str, t: torch.Tensor) -> TensorEntry:
    dtype = DTYPES.get(t.dtype)
    if dtype is None:
        raise RefreshError(f"tensor {escape_name(name)}: dtype {t.dtype} has no stored spelling")
    return TensorEntry(name, dtype, tuple(int(d) for d in t.shape))


def natural(entries: Iterable[TensorEntry]) -> tuple[TensorEntry, ...]:
    return tuple(sorted(entries, key=lambda e: natural_key(e.name)))


def catalogue_of(entries: Iterable[TensorEntry]) -> Catalogue:
    """A catalogue of the table, each tensor its own (virtual) file."""
    return Catalogue(
        ROOT, {e.name: TensorMeta(e.name, e.name, e.dtype, e.shape) for e in entries}, None
    )


def config_for(layout: EngineLayout, given: Config | str | None = None) -> Config:
    """The engine's config, by the name it sent (or ``given``), refused unless its id is the
    engine's: a trainer must cut with exactly the rules the engine checks with."""
    try:
        config = load_config(given if given is not None else layout.config)
    except LoadError as e:
        raise RefreshError(
            f"the engine's config {escape_name(layout.config)!r} cannot be read here ({e}); give "
            "the sender the same config (config=)"
        ) from None
    if config.id() != layout.config_id:
        raise RefreshError(
            f"config {escape_name(config.name)} has id {config.id()}, the engine's "
            f"{escape_name(layout.config)} has id {layout.config_id}: both sides must plan with "
            "the same rules"
        )
    return config


class Cutting:
    """The engine's plans for a version's table: each engine rank's windows, in the order they are
    sent and staged (natural order, as an export's rank file holds them)."""

    def __init__(self, entries: Iterable[TensorEntry], layout: EngineLayout, config: Config):
        self.entries = natural(entries)
        self.layout, self.config = layout, config
        self.catalogue = catalogue_of(self.entries)
        self.planner = Planner(self.catalogue, config, model=layout.model)
        self.shape = Layout(layout.tp, layout.ep)
        self.planner.check_layout(self.shape, layout.ranks)
        self._windows: dict[int, list[tuple[str, tuple[int, int], Box]]] = {}

    def plan(self, rank: int) -> RankPlan:
        return self.planner.plan(self.shape, self.layout.kind, rank)

    def windows(self, rank: int) -> list[tuple[str, tuple[int, int], Box]]:
        """(stored name, view, box) of every window engine rank ``rank`` receives: each read's
        cut, and each deferred tensor whole."""
        if rank not in self._windows:
            plan = self.plan(rank)
            out: dict[str, tuple[tuple[int, int], Box]] = {}
            for item in plan.items:
                for cut in item.cuts:
                    out[cut.name] = (cut.view, (cut.rows, cut.cols))
            for name in plan.deferred:
                meta = self.catalogue.get(name)
                view = (meta.rows, meta.row_bytes)
                out[name] = (view, ((0, view[0]), (0, view[1])))
            ordered = sorted(out.items(), key=lambda kv: natural_key(kv[0]))
            self._windows[rank] = [(n, v, b) for n, (v, b) in ordered]
        return self._windows[rank]

    def groups(self) -> list[tuple[str, ...]]:
        """The stored names that go together (a weight and its scales: one trainer rank sends and
        fingerprints them), then each deferred tensor alone."""
        e = self.planner.entries
        out = [
            tuple(n for n in (e.names[k], e.scales[k], e.scales2[k]) if n) for k in range(len(e))
        ]
        return out + [(n,) for n in self.planner.deferred]


def owned_plan(plan: RankPlan, names: frozenset[str]) -> RankPlan:
    """``plan`` cut down to the items whose weight is in ``names`` (the trainer rank that sends
    them): the same classes and cuts, a smaller arena."""
    entries = plan.all_entries
    keep = np.fromiter(
        (entries.names[k] in names for k in plan.index.tolist()), dtype=bool, count=len(plan.index)
    )
    klass = plan.klass[keep]
    arena = np.asarray([plan.table[k].arena for k in klass.tolist()], dtype=np.int64)
    ends = np.cumsum(arena)
    return dataclasses.replace(
        plan,
        index=plan.index[keep],
        klass=klass,
        offsets=ends - arena,
        deferred=tuple(n for n in plan.deferred if n in names),
        arena_bytes=int(ends[-1]) if len(ends) else 0,
    )


def host_bytes(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's bytes, flat uint8 (a view when it is contiguous)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    out: np.ndarray = t.reshape(-1).view(torch.uint8).numpy()
    return out


class TensorStorage(StorageBase):
    """The trainer's tensors behind the loader's Storage interface: each tensor whole, as if it
    were a file of its own; no manifest (the trainer vouches for its own tensors)."""

    per_rank = False
    file_digests: Mapping[Path, str] | None = None
    file_source: FileSource | None = None
    anchor_files: Mapping[Path, str] | None = None

    def __init__(self, catalogue: Catalogue, tensors: Mapping[str, torch.Tensor]) -> None:
        self.root = catalogue.root
        self.catalogue = catalogue
        self.held = {n: host_bytes(t) for n, t in tensors.items()}
        self._paths = {ROOT / n: n for n in self.held}
        self._bytes = {ROOT / n: b for n, b in self.held.items()}

    def stored(self, name: str) -> Stored:
        meta = self.catalogue.get(name)
        return Stored(name, ROOT / name, 0, meta.rows, meta.row_bytes, None)

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        return self.stored(name).seen_as(view), rows, cols

    def bytes_of(self, name: str) -> np.ndarray:
        held = self.held.get(name)
        if held is None:
            raise RefreshError(f"tensor {escape_name(name)}: this trainer rank does not hold it")
        return held

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        held = self._bytes.get(stored.path)  # a batch's span is named for messages: go by path
        if held is None:
            name = str(stored.path.relative_to(ROOT))  # each tensor its own file
            raise RefreshError(f"tensor {escape_name(name)}: this trainer rank does not hold it")
        start = stored.offset + r0 * stored.row_bytes
        out.reshape(-1)[:] = held[start : start + out.size]

    def window(self, name: str, view: tuple[int, int], box: Box) -> np.ndarray:
        """The window's bytes, ``[rows, row bytes]`` (a view of the tensor when rows are whole)."""
        (r0, r1), (c0, c1) = box
        return self.bytes_of(name).reshape(view)[r0:r1, c0:c1]

    def will_need(self, stored: Stored) -> None:
        return

    def evict(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        return

    def paths(self) -> list[Path]:
        return list(self._paths)

    def file_size(self, path: Path) -> int:
        return int(self.held[self._paths[path]].size)

    def manifest_problems(self, names: list[str]) -> list[str]:
        return []

    def changed(self) -> list[str]:
        return []

    def close(self) -> None:
        self.held, self._bytes, self._paths = {}, {}, {}


def table_of(root: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensor table (name -> (dtype, shape)) of the checkpoint an engine serves, read from its
    headers: what a :class:`~tpload.refresh.engine.RefreshReceiver` takes as ``table``."""
    from ..storage.catalogue import read_native

    catalogue, _ = read_native(Path(root), manifest=False)
    return {n: (m.dtype, tuple(m.shape)) for n, m in catalogue.tensors.items()}

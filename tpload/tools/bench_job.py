"""What every bench method is given: the checkpoint mapped whole (the peers' way to the bytes) and
this rank's plan of the windows it must end up owning; and what every arm of the bench shares
(a worker's environment, tpload-blake3's store). None of this imports tpload's kernels
(numba), so a method's own imports are timed in a process without them."""

from __future__ import annotations

import functools
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from ..codecs.base import Cut
from ..loading.pick import choose
from ..loading.planner import planner_of
from ..model.values import Layout
from ..planning.items import Output
from ..planning.planner import RankPlan
from ..storage.files import open_regular
from ..storage.safetensors import TensorInfo
from ..storage.sharded import ShardedStorage

Windows = dict[str, torch.Tensor]
"""A rank's served windows by name: what every method returns."""


class Mapped:
    """The peers' way to the bytes: each shard mapped whole (private, never written), zero-copy
    views."""

    def __init__(self, root: str) -> None:
        self.storage = ShardedStorage(Path(root).absolute())
        self.catalogue = self.storage.catalogue
        self.manifest = self.catalogue.manifest
        self._maps: dict[Path, np.ndarray] = {}

    def info(self, name: str) -> TensorInfo:
        return self.storage.info(name)

    def raw(self, name: str) -> np.ndarray:
        i = self.storage.info(name)
        arr = self._maps.get(i.path)
        if arr is None:
            fd = open_regular(i.path, "shard")  # a regular file only, as every tpload read
            try:
                arr = self._maps[i.path] = np.frombuffer(
                    mmap.mmap(fd, 0, access=mmap.ACCESS_COPY), np.uint8
                )
            finally:
                os.close(fd)
        return arr[i.begin : i.begin + i.nbytes]

    def window(self, cut: Cut) -> np.ndarray:
        """The cut's box, in the 2-D view it is cut in (a stacked tensor's: experts x rows, or one
        row per expert)."""
        return self.raw(cut.name).reshape(cut.view)[
            cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]
        ]


class Job:
    """What every method is given: the checkpoint, this rank's plan and device."""

    def __init__(
        self,
        root: str,
        config: str,
        tp: int,
        rank: int,
        world: int,
        device: torch.device,
        digest_store: str = "",
    ) -> None:
        self.root, self.config, self.tp, self.rank, self.world, self.device = (
            root,
            config,
            tp,
            rank,
            world,
            device,
        )
        self.digest_store = digest_store or None
        self.layout = Layout(tp, world // tp)
        self.bytes_hashed = 0
        self.note = ""
        self.reads = "windows"
        """What the method reads of each tensor: "windows", or more ("whole tensors", "whole
        files")."""
        self.bytes_read: int | None = None
        """Bytes this rank read out of the files, when the method reads more than its windows."""
        self.shards: object = None
        """What a method loaded, kept alive until the digest is taken (any value: only held)."""

    # The harness's own map and plan, made when a method first asks: a method that plans for itself
    # (tpload) is timed with its own planning only, not with this one too.
    @functools.cached_property
    def ckpt(self) -> Mapped:
        return Mapped(self.root)

    @functools.cached_property
    def plan(self) -> RankPlan:
        config = choose(self.config, Path(self.root).absolute())[0]
        planner = planner_of(self.ckpt.catalogue, config)
        return planner.plan(self.layout, "packed", self.rank)

    def outputs(self) -> list[tuple[Output, Cut]]:
        """(served tensor, cut) of every packed output (a weight, its scale, a global scale), in
        plan order."""
        return [
            (o, c)
            for item in self.plan.items
            for o, c in zip(item.outputs, (item.weight, *item.scales), strict=False)
        ]

    def cuts(self) -> list[tuple[str, Cut]]:
        """(served name, cut) of every packed output, in plan order."""
        return [(o.name, c) for o, c in self.outputs()]

    def by_tensor(self) -> dict[str, list[tuple[Output, Cut]]]:
        """Every stored tensor this rank has a window of, with its outputs (for methods that read
        whole tensors)."""
        out: dict[str, list[tuple[Output, Cut]]] = {}
        for o, cut in self.outputs():
            out.setdefault(cut.name, []).append((o, cut))
        return out


def blake3_store(digest_store: str) -> Path:
    """tpload-blake3's own store, inside the bench's: the other tpload methods must not find its
    sidecar."""
    return Path(digest_store) / "blake3"


def worker_env(nproc: int) -> dict[str, str]:
    """The environment of a bench run's torchrun job of ``nproc`` workers (the table's and the
    replicas' arms alike)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Pin the workers to this checkout of tpload, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env

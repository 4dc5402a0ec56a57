"""The planner of an opened checkpoint: its config.json read (checked against the manifest's pin,
loading/pick.py) and handed to planning's :class:`~tpload.planning.planner.Planner`, which reads
no file itself."""

from __future__ import annotations

from pathlib import Path

from ..planning.planner import Planner
from ..selection.config import Config
from ..storage.catalogue import Catalogue
from .pick import model_for


def planner_of(catalogue: Catalogue, config: Config) -> Planner:
    """A planner of ``catalogue`` under ``config``, given the checkpoint's config.json (the planner
    itself reads no file)."""
    model = model_for(Path(catalogue.root), config, pins=catalogue.pins, header=catalogue.gguf)
    return Planner(catalogue, config, model=model)

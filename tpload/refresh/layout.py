"""What engine rank 0 tells every trainer rank when the transfer group is joined: the engine's
layout, so the trainer plans each engine rank's windows with the loader's planner exactly as the
engine will check them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.errors import LoadError
from ..model.text import escape_name
from .terms import RefreshError


@dataclass(frozen=True)
class EngineLayout:
    """The engine's side of a plan: the config (by name, and by id so a trainer holding another
    definition of the same name is refused), the tp x ep layout, the kind it serves, how many
    engine ranks take part in the transfer group, and the model's config.json (the rules that cut
    by heads read it; None when the model has none)."""

    config_id: str
    tp: int
    ep: int
    kind: str
    ranks: int
    """Engine ranks in the transfer group (tp x ep)."""
    config: str = ""
    """The config's name as the engine loaded it (a shipped name, ``ARCH+FAMILY``, or a path)."""
    model: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    """The model's config.json, as a mapping (None: none)."""

    def __post_init__(self) -> None:
        ints = (self.tp, self.ep, self.ranks)
        if not all(type(v) is int and v >= 1 for v in ints) or self.ranks != self.tp * self.ep:
            raise RefreshError(
                f"engine layout: tp {self.tp!r} x ep {self.ep!r} on {self.ranks!r} ranks is not a "
                "layout (integers >= 1, ranks = tp x ep)"
            )

    def to_bytes(self) -> bytes:
        doc = {
            "config_id": self.config_id,
            "tp": self.tp,
            "ep": self.ep,
            "kind": self.kind,
            "ranks": self.ranks,
            "config": self.config,
            "model": dict(self.model) if self.model is not None else None,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> EngineLayout:
        """The layout as engine rank 0 sent it; anything else is a :class:`RefreshError`."""
        from ..storage.files import parse_json  # one parser: a key given twice is refused

        try:
            doc = parse_json(raw, Path("engine rank 0"), "the engine layout")
            if not isinstance(doc, dict) or not all(
                isinstance(doc.get(k), str) for k in ("config_id", "kind", "config")
            ):
                raise ValueError("not a layout")
            model = doc.get("model")
            if model is not None and not isinstance(model, dict):
                raise ValueError("model is not a mapping")
            return cls(
                doc["config_id"],
                doc["tp"],
                doc["ep"],
                doc["kind"],
                doc["ranks"],
                config=doc["config"],
                model=model,
            )
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, LoadError) as e:
            if isinstance(e, RefreshError):
                raise
            raise RefreshError(
                f"engine rank 0 sent no engine layout ({escape_name(str(e))[:200]})"
            ) from None

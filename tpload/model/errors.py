"""The one exception family tpload raises for bad input or a failed load.

Every message is meant to be read by a serving engineer at 3 a.m.: it names
the file, the tensor, the rank (where there is one) and what was expected.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LayoutError",
    "LoadError",
    "OptionsError",
    "StoodDown",
    "raise_all",
]


class LoadError(Exception):
    """A load could not produce verified weights; nothing was served."""

    reporter: int | None
    """When every rank raises this same message (a verdict all ranks reached from the exchanged
    table): the one rank that prints it in full, the lowest failing one, so that a launch of N ranks
    shows it once. None: this rank's own message, printed by this rank."""

    def __init__(self, *args: object, reporter: int | None = None) -> None:
        super().__init__(*args)
        self.reporter = reporter


class StoodDown(LoadError):
    """This rank stopped because another rank failed (in the handshake before the copy loop, or a
    replica that stopped sending mid-window): the cause is that rank's message, not this one's."""


class CheckpointError(LoadError):
    """The checkpoint on disk is malformed, incomplete or corrupt."""


class ConfigError(LoadError):
    """The TOML config is malformed or does not fit the checkpoint."""


class LayoutError(LoadError):
    """The requested tp x ep layout cannot be cut from this checkpoint."""


class OptionsError(LoadError):
    """An option given to ``load()`` or on the command line is not valid."""


def raise_all(kind: type[LoadError], problems: list[str], *, what: str) -> None:
    """Raise one ``kind`` listing every problem (safetensors style: all at once)."""
    if not problems:
        return
    if len(problems) == 1:
        raise kind(problems[0])
    listing = "\n  - ".join(problems)
    raise kind(f"{len(problems)} {what}:\n  - {listing}")

"""The configs a load gets when none is named: ``auto`` (chosen from the checkpoint's config.json),
and the reference layout for a folder without one. Two names the options, the config loader and the
tools all read, kept where none of them has to import another."""

from __future__ import annotations

DEFAULT_CONFIG = "auto"
# the layout of docs/format.md, for checkpoints without a config.json
REFERENCE_CONFIG = "deepseek-v4-mtp"

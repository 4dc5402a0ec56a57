"""Shared fixtures: small synthetic checkpoints, written once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpload.synth import PRESETS, write_checkpoint


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small preset, written once per session; tests must not modify it (copy it first)."""
    return write_checkpoint(tmp_path_factory.mktemp("small"), PRESETS["small"])


@pytest.fixture
def ckpt_copy(small_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the small checkpoint that a test may corrupt."""
    dst = tmp_path / "ckpt"
    shutil.copytree(small_ckpt, dst)
    return dst

"""Shared fixtures: small synthetic checkpoints written once per session, and a hermetic home."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpload.tools.synth import PRESETS, write_checkpoint


@pytest.fixture(scope="session", autouse=True)
def hermetic_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Trusted digests and the built-in checkpoint go to this session's folders, never the user's
    home (torchrun launches inherit the environment)."""
    saved = {k: os.environ.get(k) for k in ("XDG_STATE_HOME", "TPLOAD_CACHE")}
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    os.environ["TPLOAD_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


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

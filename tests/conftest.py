"""Shared fixtures: small synthetic checkpoints written once per session, and a hermetic home."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpload.tools.synth import PRESETS, write_checkpoint


def pytest_configure(config: pytest.Config) -> None:
    """Where bytecode may not be written beside the sources (PYTHONDONTWRITEBYTECODE, as on the
    development VM), keep it in pytest's cache folder instead, for this process and every process
    the tests start: otherwise each torchrun rank and `python -m tpload` (about a hundred a run)
    compiles tpload from source again, and pytest rewrites every test module again each run.
    Nothing is written beside the sources; where bytecode may be written, nothing changes."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if not sys.dont_write_bytecode or cache is None:
        return
    prefix = str(cache.mkdir("pycache"))
    config.stash[_SAVED_ENV] = {
        k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False  # pytest's process
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix


def pytest_unconfigure(config: pytest.Config) -> None:
    saved = config.stash.get(_SAVED_ENV, None)
    if saved is None:
        return
    sys.pycache_prefix, sys.dont_write_bytecode = None, True
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_SAVED_ENV = pytest.StashKey[dict[str, str | None]]()


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

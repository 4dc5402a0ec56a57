"""The kernels' two implementations (numba's, and the same compiled ahead: kernels/ahead.py): the
ahead-of-time module is built once a session (about 10-20 s), here only, and the kernel tests that
use :func:`implementation` run over both."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpload.kernels import ahead, lazy
from tpload.kernels.calls import Kernels


@pytest.fixture(scope="session")
def ahead_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the kernels compiled ahead where ``NUMBA_CACHE_DIR`` set to
    :func:`numba_cache_dir` of it would have them."""
    root = tmp_path_factory.mktemp("numba-cache")
    folder = root / ahead.subpath(ahead.KERNELS)
    done = subprocess.run(
        [sys.executable, "-m", "tpload.kernels.build", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def numba_cache_dir(folder: Path) -> Path:
    """The ``NUMBA_CACHE_DIR`` under which :func:`.ahead.cache_folders` finds ``folder``."""
    return folder.parent


@pytest.fixture(scope="session")
def ahead_kernels(ahead_folder: Path) -> Kernels:
    found = ahead.load([ahead_folder])
    assert found is not None and found.implementation == "ahead"
    return found


@pytest.fixture
def copied(ahead_folder: Path, tmp_path: Path) -> Path:
    """A private copy of the built folder that a test may damage."""
    dst = tmp_path / ahead_folder.name
    shutil.copytree(ahead_folder, dst)
    return dst


@pytest.fixture(params=["numba", "ahead"])
def implementation(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kernels]:
    """Each implementation in turn behind :data:`tpload.kernels.lazy.kernels` (what the load path
    and the fingerprint call)."""
    if request.param == "numba":
        from tpload.kernels import compiled

        chosen: Kernels = compiled.KERNELS
    else:
        chosen = request.getfixturevalue("ahead_kernels")
    monkeypatch.setattr(lazy.kernels, "_module", chosen)
    yield chosen

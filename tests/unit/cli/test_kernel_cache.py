"""The first run's note names the folder numba really keeps the compiled kernels in, and says
nothing once they are there (tpload/cli/kernel_cache.py)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from tpload.cli import kernel_cache as kc
from tpload.cli.load import first_run_notes


def test_numba_keeps_the_kernels_where_the_note_says() -> None:
    import tpload.kernels.compiled  # noqa: F401  compiled (or loaded from numba's cache) here

    folder = kc.kernel_cache()
    assert kc.compiled(folder), sorted(os.listdir(folder))  # numba wrote its index there
    if "NUMBA_CACHE_DIR" not in os.environ:
        assert folder == kc.KERNELS / "__pycache__"  # the checkout is writable: in the tree


def test_the_note_is_said_before_the_compile_and_never_once_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("RANK", "0")
    caplog.set_level(logging.INFO, logger="tpload")
    source = tmp_path / "kernels"
    source.mkdir()
    monkeypatch.setattr(kc, "KERNELS", source)
    first_run_notes(str(tmp_path))
    said = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert said == [
        f"compiling tpload's CPU kernels once (about 10 s; cached in {source / '__pycache__'}; "
        "`python -m tpload kernels` compiles them ahead, for a faster first call)"
    ]
    (source / "__pycache__" / "compiled.gather_windows-10.py311.nbi").write_bytes(b"")
    caplog.clear()
    first_run_notes(str(tmp_path))
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_a_package_folder_numba_cannot_write_means_its_user_wide_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "site" / "kernels"
    source.mkdir(parents=True)
    (source / "__pycache__").write_text("a file where the folder would be")  # cannot be made
    sha = hashlib.sha1(str(source).encode()).hexdigest()
    assert kc.kernel_cache(source) == tmp_path / "cache" / "numba" / f"kernels_{sha}"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nc"))  # numba's own override first
    assert kc.kernel_cache(source) == tmp_path / "nc" / f"kernels_{sha}"


def test_no_note_once_the_kernels_are_compiled_ahead_and_the_command_says_so(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tpload.cli import main
    from tpload.kernels import ahead

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("RANK", "0")
    caplog.set_level(logging.INFO, logger="tpload")
    source = tmp_path / "kernels"
    (source / "__pycache__").mkdir(parents=True)
    monkeypatch.setattr(kc, "KERNELS", source)
    for path in ahead.paths(source / "__pycache__"):  # numba's index is not there: nothing compiles
        path.write_text("")
    first_run_notes(str(tmp_path))
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]
    assert main(["kernels"]) == 0  # there already: nothing built
    assert "compiled ahead already" in capsys.readouterr().out

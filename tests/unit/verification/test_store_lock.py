"""The digest store's lock file: a FIFO or a link planted in its place is refused at once, by name
(an open of a FIFO for writing would otherwise block until someone read it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tpload.model.errors import LoadError
from tpload.verification.store import DigestStore


def _write(store: Path) -> Path:
    return DigestStore(store).write("ab" * 32, store.parent, "tp1", ["d" * 64], {"a": 1})


def test_a_lock_planted_as_a_fifo_or_a_link_is_refused_without_blocking(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    assert _write(store).exists()  # a plain lock file: the write goes through
    (store / ".lock").unlink()
    os.mkfifo(store / ".lock", 0o600)
    started = time.monotonic()
    planted = r"\.lock: the digest store's lock (cannot be opened|is not a regular file)"
    with pytest.raises(LoadError, match=planted):
        _write(store)
    assert time.monotonic() - started < 5
    (store / ".lock").unlink()
    (store / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LoadError, match="the digest store's lock cannot be opened"):
        _write(store)
    assert not (tmp_path / "elsewhere").exists()

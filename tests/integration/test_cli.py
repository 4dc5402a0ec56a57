"""README's first command under real torchrun: the built-in checkpoint, made once, loaded on 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

from ..helpers import tpload_cli


def test_readme_default_loads_the_builtin_checkpoint(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    run = tpload_cli(2, "--report", str(report), env={"TPLOAD_CACHE": str(tmp_path / "cache")})
    assert run.rc == 0, run.text
    assert "verified:" in run.out and "rank node" in run.out
    assert "using the built-in synthetic checkpoint" in run.err  # said before the silent first seconds
    doc = json.loads(report.read_text())
    assert len(doc["ranks"]) == 2 and doc["tp"] == 2 and doc["verify"] == "node"
    assert all(r["failed"] == 0 and r["tensors"] > 0 for r in doc["ranks"])
    assert any((tmp_path / "cache").glob("synth-*/NATIVE_MANIFEST.json"))  # made once, cached

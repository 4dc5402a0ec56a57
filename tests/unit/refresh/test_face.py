"""The refresh's face imports nothing until a name is asked for, and every name it offers is
there."""

from __future__ import annotations

import subprocess
import sys

import tpload.refresh as refresh


def test_the_face_imports_nothing_and_names_what_it_offers() -> None:
    probe = "import sys, tpload.refresh; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert sorted(refresh.__all__) == sorted(refresh._LAZY)
    for name in refresh.__all__:
        assert getattr(refresh, name).__name__ == name
    assert issubclass(refresh.RefreshError, __import__("tpload").LoadError)

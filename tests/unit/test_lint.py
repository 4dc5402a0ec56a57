"""The tree is ruff-clean (lint and format, pyproject.toml's settings) and keeps its shape
(import-linter's contracts in pyproject.toml, the gate's import closure within .ci/run's limit), so
the README's test command catches what CI's `ruff check`, `lint-imports` and
`.ci/gate-closure.py` would."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = (  # the lint-imports command, run by this interpreter
    "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
)
needs_importlinter = pytest.mark.skipif(
    importlib.util.find_spec("importlinter") is None, reason="import-linter is in the [test] extra"
)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is in the [test] extra")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff_finds_nothing(args: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def lint_imports() -> subprocess.CompletedProcess:
    """`lint-imports` on this checkout (it puts the working directory first on the path), with no
    cache: a planted module must be seen."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def lint_with(planted: dict[Path, str]) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``planted`` (each file's path and text) written into the package for
    the run, and removed after it."""
    try:
        for path, text in planted.items():
            path.write_text(text)
        return lint_imports()
    finally:
        for path in planted:
            path.unlink(missing_ok=True)


@needs_importlinter
def test_the_import_contracts_hold() -> None:
    run = lint_imports()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


@needs_importlinter
def test_a_planted_upward_import_and_a_core_import_of_a_tool_break_the_contracts() -> None:
    planted = {
        ROOT / "tpload" / "model" / "_planted_for_test.py": "from ..loading import loop\n",
        ROOT / "tpload" / "verification" / "_planted_for_test.py": "from ..tools import synth\n",
    }
    run = lint_with(planted)
    out = run.stdout
    assert run.returncode == 1, out[-4000:] + run.stderr[-2000:]
    assert "tpload.model is not allowed to import tpload.loading" in out
    assert "tpload.model._planted_for_test -> tpload.loading.loop" in out
    assert "tpload.verification is not allowed to import tpload.tools" in out
    assert re.search(r"the library never imports its tools or its command line\s+BROKEN", out)


@needs_importlinter
def test_a_plan_naming_storage_and_a_report_naming_the_gate_break_the_contracts() -> None:
    """The nevers of docs/architecture.md's drawing that the layers allow: planning and selection
    name no storage (but the bounded reader, for config.py alone), report nothing of the gate."""
    planted = {
        ROOT / "tpload" / "planning" / "_planted_for_test.py": "from ..storage import catalogue\n",
        ROOT / "tpload" / "selection" / "_planted_for_test.py": "from ..storage import files\n",
        ROOT / "tpload" / "report" / "_planted_for_test.py": "from ..verification import terms\n",
    }
    run = lint_with(planted)
    out = run.stdout
    assert run.returncode == 1, out[-4000:] + run.stderr[-2000:]
    assert "tpload.planning is not allowed to import tpload.storage" in out
    assert "tpload.planning._planted_for_test -> tpload.storage.catalogue" in out
    assert "tpload.selection is not allowed to import tpload.storage" in out
    assert "tpload.selection._planted_for_test -> tpload.storage.files" in out
    assert "tpload.report is not allowed to import tpload.verification" in out
    assert "tpload.report._planted_for_test -> tpload.verification.terms" in out


def test_the_gate_closure_stays_within_the_ci_limit() -> None:
    limit = re.search(r"gate-closure\.py (.*)--max (\d+)", (ROOT / ".ci" / "run").read_text())
    assert limit is not None
    run = subprocess.run(
        [sys.executable, ".ci/gate-closure.py", *limit.group(1).split(), "--max", limit.group(2)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.match(r"tpload\.verification\.gate: \d+ modules", run.stdout)

"""The scripts a GPU machine runs (launch/) and the tests' worker scripts (tests/workers/) are never
imported by the suite on this machine: every tpload name they import must still exist, and every
shell script must parse, so that a rename is caught here, not on the GPU machine."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(ROOT / "launch").glob("*.py"), *(ROOT / "tests" / "workers").glob("*.py")])


def _fallbacks(tree: ast.AST) -> set[ast.AST]:
    """Imports in an ``except ImportError:`` body: written for an older tree, where the import
    tried first does not resolve (launch/plan-speed.py runs against older checkouts)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and "ImportError" in ast.unparse(node.type or []):
            for stmt in node.body:
                out.update(ast.walk(stmt))
    return out


def _needs_other_package(module: str, error: ImportError) -> bool:
    """A tpload module that exists but imports a package this machine lacks (the vLLM engine
    modules without vLLM): its file is there, so the name is not gone."""
    other = getattr(error, "name", None) or ""
    return (
        isinstance(error, ModuleNotFoundError)
        and other.split(".")[0] != "tpload"
        and importlib.util.find_spec(module) is not None
    )


def missing(path: Path) -> list[str]:
    """Every ``from tpload... import name`` and ``import tpload.x`` in ``path`` that does not
    resolve (a fallback for older trees apart), as ``line: what``."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    fallbacks = _fallbacks(tree)
    for node in ast.walk(tree):
        if node in fallbacks:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "tpload":
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                if _needs_other_package(node.module, e):
                    continue
                out.append(f"{node.lineno}: {node.module} ({e})")
                continue
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:  # a submodule not imported by its package yet
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    out.append(f"{node.lineno}: {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "tpload":
                    continue
                try:
                    importlib.import_module(alias.name)
                except ImportError as e:
                    out.append(f"{node.lineno}: {alias.name} ({e})")
    return out


def test_there_are_scripts_to_check() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"replicas_nccl.py", "replicas_corrupt.py", "kill.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_tpload_name_a_script_imports_exists(path: Path) -> None:
    assert missing(path) == []


def test_the_check_catches_a_name_that_is_gone(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\n"
        "import tpload.sources.replicas\n"
        "import tpload.no_such_module\n"
        "from tpload.distributed.world import init_world, keep_world\n"
        "\n"
        "def main():\n"
        "    from tpload.distributed import wire\n"
        "    from tpload.gone import thing\n"
        "    try:\n"
        "        from tpload.sources.replicas import gone_too\n"
        "    except ImportError:  # an older tree\n"
        "        from tpload.sources.replicas import old_name\n"
    )
    found = missing(bad)
    assert [f.split(" (")[0] for f in found] == [
        "3: tpload.no_such_module",
        "4: tpload.distributed.world.keep_world",
        "8: tpload.gone",
        "10: tpload.sources.replicas.gone_too",
    ]


def test_every_launch_shell_script_parses() -> None:
    scripts = sorted((ROOT / "launch").glob("*.sh"))
    assert scripts
    for script in scripts:
        run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert run.returncode == 0, f"{script.name}: {run.stderr}"

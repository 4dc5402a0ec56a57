"""The tools and launch scripts use the core by its public names only.

``tpload/tools/`` and ``launch/`` import the core's modules directly, by the names they document
(docs/development.md, "How the tools reach the core"); the core never imports a tool
(import-linter's ``core-not-tools``). What holds here, for the package and for launch/ (no package,
so no contract reads it), function-local imports included: no tool and no launch script imports a
private name of tpload (``_x``) or a private module, so an internal can change without a tool
breaking unseen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _fallbacks(tree: ast.AST) -> set[ast.AST]:
    """Imports in an ``except ImportError:`` body (a launch script's way into an older tree)."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and "ImportError" in ast.unparse(node.type or []):
            for stmt in node.body:
                out.update(ast.walk(stmt))
    return out


def private_imports(path: Path, package: str | None) -> list[str]:
    """Every import in ``path`` (an older tree's fallback apart) of a private name or module of
    tpload, as ``line: what``. ``package``: the module's package, for its relative imports (None:
    a script)."""
    tree = ast.parse(path.read_text(), str(path))
    fallbacks = _fallbacks(tree)
    out = []
    for node in ast.walk(tree):
        if node in fallbacks:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                assert package is not None, f"{path}: a relative import in a script"
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] != "tpload":
                continue
            parts = [*module.split("."), *(a.name for a in node.names)]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                out.append(f"{node.lineno}: {module}: {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            out += [
                f"{node.lineno}: {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "tpload"
                and any(p.startswith("_") and not p.startswith("__") for p in a.name.split("."))
            ]
    return out


TOOLS = sorted((ROOT / "tpload" / "tools").glob("*.py"))
LAUNCH = sorted((ROOT / "launch").glob("*.py"))


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_no_tool_imports_a_private_name_of_the_core(path: Path) -> None:
    assert private_imports(path, "tpload.tools") == []


@pytest.mark.parametrize("path", LAUNCH, ids=lambda p: p.name)
def test_no_launch_script_imports_a_private_name_of_the_core(path: Path) -> None:
    assert private_imports(path, None) == []


def test_the_check_sees_a_private_reach(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from ..planning.planner import planner_of\n"
        "from ..model.errors import LoadError\n"
        "from .synth import PRESETS\n"
        "def f():\n"
        "    from ..loading.loop import _sample_spans\n"
        "    import tpload.kernels._private\n"
        "    from ..kernels import _private\n"
        "    try:\n"
        "        from ..x import y\n"
        "    except ImportError:\n"
        "        from ..x import _old\n"
    )
    assert private_imports(bad, "tpload.tools") == [
        "5: tpload.loading.loop: _sample_spans",
        "6: tpload.kernels._private",
        "7: tpload.kernels: _private",
    ]

"""The package's shape: the core never imports a tool (every module outside tpload/tools/ and the
command line, tpload/cli/, is read for imports of it) and nothing but ``python -m tpload`` imports
the command line. A module is as long as its one job needs: the layers are held by contracts
(import-linter, the type checker), not by line counts."""

from __future__ import annotations

import ast
from pathlib import Path

import tpload

PACKAGE = Path(tpload.__file__).parent
TOOLS = PACKAGE / "tools"
CLI = PACKAGE / "cli"  # above the core and the tools: it runs the tools' subcommands


def tool_imports(path: Path, layer: str = "tools") -> list[str]:
    """Every import in ``path`` that reaches tpload.``layer`` (absolute or relative)."""
    rel = path.relative_to(PACKAGE).parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = list(rel[: len(rel) - node.level + 1]) if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" for a in node.names]
            if node.level == 0:
                target = (node.module or "").removeprefix("tpload.").removeprefix("tpload")
                names = [f"{target}.{a.name}" for a in node.names]
            if any(
                n.split(".")[0] == layer or n.lstrip(".").startswith(layer)
                for n in [target, *names]
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.relative_to(PACKAGE)}:{node.lineno}"
                for a in node.names
                if a.name.startswith(f"tpload.{layer}")
            ]
    return found


def test_core_never_imports_a_tool() -> None:
    core = [
        p
        for p in PACKAGE.rglob("*.py")
        if TOOLS not in p.parents and CLI not in p.parents and p.name != "__main__.py"
    ]
    assert len(core) > 50
    assert [hit for p in core for hit in tool_imports(p)] == []


def test_nothing_but_python_m_tpload_imports_the_command_line() -> None:
    below = [p for p in PACKAGE.rglob("*.py") if CLI not in p.parents and p.name != "__main__.py"]
    assert len(below) > 60
    assert [hit for p in below for hit in tool_imports(p, "cli")] == []


def test_the_check_sees_a_relative_import_of_a_tool(tmp_path: Path) -> None:
    planted = PACKAGE / "verification" / "_planted_for_test.py"
    planted.write_text("from ..tools.synth import PRESETS\n")
    try:
        assert tool_imports(planted) == ["verification/_planted_for_test.py:1"]
        planted.write_text("from .. import cli\nimport tpload.cli.output\n")
        assert tool_imports(planted, "cli") == [
            "verification/_planted_for_test.py:1",
            "verification/_planted_for_test.py:2",
        ]
    finally:
        planted.unlink()

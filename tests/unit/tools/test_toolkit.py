"""The tools' internal API (tpload/toolkit.py): its table, its lazy imports, and who keeps to it.

* the table (``FACE``) and the face's TYPE_CHECKING imports (what mypy and import-linter read) name
  the same objects, each the one its module holds, none private;
* importing the face imports nothing else;
* no tool, and no launch script but the two that time an internal on purpose, imports a core module
  around the face, nor a private name (import-linter's ``tools-through-toolkit`` contract holds the
  package; these checks also hold launch/, which is no package, and function-local imports);
* docs/development.md lists exactly the face's names.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpload import toolkit

ROOT = Path(__file__).resolve().parents[3]

ALLOWED = ("tpload.toolkit", "tpload.model", "tpload.tools", "tpload.api")
"""What a tool or a launch script may import of tpload besides ``tpload`` itself (and below
these)."""

FACES = ("tpload.refresh", "tpload.integrations.vllm_trainer")
"""Public faces a script may import by name, not their modules: the refresh's and its vLLM
trainer's (docs/refresh.md)."""

ON_PURPOSE = {
    "first-call.py": {"tpload.storage"},  # its spy patches the class every read goes through
    "replica-split-speed.py": {"tpload.distributed.replica_split"},  # what it times
    "load-walk.py": {"tpload.storage"},  # the storage class whose walk it follows
}
"""Launch scripts that time or trace an internal of the core, and the module they reach for it."""


def type_checking_imports() -> dict[str, str]:
    """{name: ``module`` or ``module:its name there``} of the face's ``if TYPE_CHECKING:`` block."""
    tree = ast.parse((ROOT / "tpload" / "toolkit.py").read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    out = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names:
            name = alias.asname or alias.name
            out[name] = node.module if name == alias.name else f"{node.module}:{alias.name}"
    return out


def test_the_table_and_the_type_checking_imports_name_the_same_objects() -> None:
    assert type_checking_imports() == {name: where for name, (where, _) in toolkit.FACE.items()}
    assert toolkit.__all__ == sorted(toolkit.FACE)
    # a name imported under another one is exported to the type checker by a literal list (it
    # reads no computed __all__): the second TYPE_CHECKING block names each, and only those
    tree = ast.parse((ROOT / "tpload" / "toolkit.py").read_text())
    second = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ][1]
    (added,) = second.body
    assert isinstance(added, ast.AugAssign) and isinstance(added.value, ast.List)
    renamed = {n for n, where in type_checking_imports().items() if ":" in where}
    assert [ast.literal_eval(e) for e in added.value.elts] == sorted(
        renamed, key=list(type_checking_imports()).index
    )


def test_every_name_is_its_module_s_object_public_and_described() -> None:
    for name, (where, what) in toolkit.FACE.items():
        module, _, attr = where.partition(":")
        expected = getattr(importlib.import_module(f"tpload.{module}"), attr or name)
        assert getattr(toolkit, name) is expected, name
        assert not name.startswith("_") and not (attr or name).startswith("_"), name
        assert what and "\n" not in what, name
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        toolkit.no_such_name  # noqa: B018  the attribute access is what is tested


def test_importing_the_face_imports_nothing_of_the_core() -> None:
    code = "import sys, tpload.toolkit; print(sorted(m for m in sys.modules if m[:6] == 'tpload'))"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['tpload', 'tpload.toolkit']"


def _fallbacks(tree: ast.AST) -> set[ast.AST]:
    """Imports in an ``except ImportError:`` body (a launch script's way into an older tree)."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and "ImportError" in ast.unparse(node.type or []):
            for stmt in node.body:
                out.update(ast.walk(stmt))
    return out


def core_imports(path: Path, package: str | None) -> list[str]:
    """Every import in ``path`` (function-local ones too; an older tree's fallback apart) of a
    tpload module outside :data:`ALLOWED`, or of a private name of tpload, as ``line: what``.
    ``package``: the module's package, for its relative imports (None: a script)."""
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
            names = [a.name for a in node.names]
            # `from .. import x`: x is a module of tpload's, or one of its names (load, the errors)
            modules = [f"tpload.{n}" for n in names] if module == "tpload" else [module]
            out += [
                f"{node.lineno}: {m}"
                for m in modules
                if m != "tpload" and not m.startswith(ALLOWED) and m not in FACES
            ]
            out += [f"{node.lineno}: {module}.{n} (private)" for n in names if n.startswith("_")]
        elif isinstance(node, ast.Import):
            out += [
                f"{node.lineno}: {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "tpload"
                and a.name != "tpload"
                and not a.name.startswith(ALLOWED)
                and a.name not in FACES
            ]
    return out


TOOLS = sorted((ROOT / "tpload" / "tools").glob("*.py"))
LAUNCH = sorted((ROOT / "launch").glob("*.py"))


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_no_tool_imports_the_core_around_the_face(path: Path) -> None:
    assert core_imports(path, "tpload.tools") == []


@pytest.mark.parametrize("path", LAUNCH, ids=lambda p: p.name)
def test_a_launch_script_imports_the_core_through_the_face(path: Path) -> None:
    found = core_imports(path, None)
    on_purpose = tuple(ON_PURPOSE.get(path.name, ()))
    assert [
        f for f in found if not on_purpose or not f.split(": ", 1)[1].startswith(on_purpose)
    ] == []
    if on_purpose:  # the exception is still needed: else it goes
        assert found, f"{path.name} no longer reaches {on_purpose}: drop it from ON_PURPOSE"


def test_the_check_sees_a_tool_reaching_into_the_loop(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from ..toolkit import planner_of\n"
        "from ..model.errors import LoadError\n"
        "from .synth import PRESETS\n"
        "from .. import api\n"
        "def f():\n"
        "    from ..loading.loop import decode_rows\n"
        "    from ..toolkit import _private\n"
        "    import tpload.planning.classify\n"
        "    from .. import planning\n"
    )
    assert sorted(core_imports(bad, "tpload.tools")) == [
        "6: tpload.loading.loop",
        "7: tpload.toolkit._private (private)",
        "8: tpload.planning.classify",
        "9: tpload.planning",
    ]


def test_development_md_lists_the_face() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## The tools' internal API\n", 1)[1].split("\n## ", 1)[0]
    listed = section.split("\n- ", 1)[1]  # the list, after the paragraph
    assert set(re.findall(r"`(\w+)`", listed)) == set(toolkit.FACE)

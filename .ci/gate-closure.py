#!/usr/bin/env python3
"""The gate's import closure: every tpload module that importing the gate can run.

Counted by reading source with ast (nothing is imported): every `import` and `from ... import` at
any depth (module level, in functions, under `if` and `try`), relative ones resolved; a `from P
import n` where P.n is a module counts P.n; importing a.b.c runs a/__init__ and a/b/__init__ too;
a string constant that is exactly a tpload module's dotted name (importlib.import_module's
argument) counts as an import; `from tpload import X` where X is one of tpload/__init__.py's lazy
names (_LAZY) counts the module it maps to. Imports under `if TYPE_CHECKING:` never run and are
left out, unless --type-checking (what a type checker reads): then they count in every module but
tpload/__init__.py, whose TYPE_CHECKING block only names its lazy exports. tpload/__init__.py's
`__getattr__` runs only when one of its lazy names is asked for, never on importing a submodule:
its imports count with that name's module, not in every closure.

    python .ci/gate-closure.py [--start MODULE] [--max N] [--list] [--type-checking]

Exits 1 when the closure holds more than N modules (default: no limit). .ci/run gives today's
count as N, so the closure can only shrink (issue 29: the gate is to be a small kernel of at most
20 modules).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "tpload"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / PKG).rglob("*.py") if "__pycache__" not in p.parts}


def lazy_names(mods: dict[str, Path]) -> dict[str, str]:
    tree = ast.parse(mods[PKG].read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "_LAZY"
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value: PKG + v.value
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


def under_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(
    name: str,
    mods: dict[str, Path],
    lazy: dict[str, str],
    typing: bool = False,
    door: frozenset[str] = frozenset(),
) -> set[str]:
    """``door``: what the root's ``__getattr__`` imports, counted with each lazy name it serves."""
    path = mods[name]
    typing = typing and name != PKG
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and under_type_checking(child) and not typing:
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if name == PKG and isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return  # runs for a lazy name only: `door`, counted where one is imported
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG or alias.name.startswith(PKG + "."):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            if base == PKG or base.startswith(PKG + "."):
                found.add(base)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        found.add(sub)
                    elif base == PKG and alias.name in lazy:
                        found.update({lazy[alias.name], *door})
        elif isinstance(node, ast.If) and under_type_checking(node) and not typing:
            for sub in node.orelse:
                visit_stmt(sub)
            return
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in mods
            and node.value not in (name, PKG)
        ):
            found.add(node.value)
        visit(node)

    visit(ast.parse(path.read_text()))
    return found


def door_imports(mods: dict[str, Path]) -> frozenset[str]:
    """What the root's ``__getattr__`` (the lazy door) imports when it serves a name."""
    for node in ast.parse(mods[PKG].read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            found: set[str] = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.level:
                    found.add(".".join([PKG, *([sub.module] if sub.module else [])]))
                    found.update(f"{PKG}.{sub.module}.{a.name}" for a in sub.names if sub.module)
                elif isinstance(sub, ast.ImportFrom | ast.Import):
                    raise SystemExit("the lazy door imports by relative import only: count it")
            return frozenset(m for m in found if m in mods)
    return frozenset()


def closure(start: str, mods: dict[str, Path], typing: bool = False) -> set[str]:
    lazy = lazy_names(mods)
    door = door_imports(mods)
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        # `import a.b.c` of something that is not a module: the longest prefix that is one
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in seen or name not in mods:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parents' __init__
        todo.extend(imports_of(name, mods, lazy, typing, door))
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--start", default="tpload.verification.gate")
    ap.add_argument("--max", type=int, default=None)
    ap.add_argument("--list", action="store_true", help="print every module with its lines")
    ap.add_argument("--type-checking", action="store_true", help="count TYPE_CHECKING imports too")
    args = ap.parse_args()
    mods = modules()
    reach = closure(args.start, mods, args.type_checking)
    lines = {m: len(mods[m].read_text().splitlines()) for m in reach}
    if args.list:
        for m in sorted(reach):
            print(f"{lines[m]:6d}  {mods[m].relative_to(ROOT)}")
    what = "import closure" + (", TYPE_CHECKING imports included" if args.type_checking else "")
    print(f"{args.start}: {len(reach)} modules, {sum(lines.values())} lines in its {what}")
    if args.max is not None and len(reach) > args.max:
        print(f"more than {args.max} modules: the gate must stay a small kernel", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/architecture.md's package-to-package table is the code's import graph, row by row.

Read as ``lint-imports`` reads the package (grimp, TYPE_CHECKING imports included): each row's
package imports exactly the packages the row names (a file named in a row, ``storage/files.py``,
counts as its package; words in parentheses say why, and are not read)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def code_imports() -> dict[str, set[str]]:
    """{first-level package or module: the others it imports}, from the code."""
    graph = grimp.build_graph("tpload", exclude_type_checking_imports=False)
    out: dict[str, set[str]] = {}
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            other = imported.split(".")
            if len(other) >= 2 and other[1] != parts[1]:
                out.setdefault(parts[1], set()).add(other[1])
    return out


def doc_imports() -> dict[str, set[str]]:
    """{package: the packages its row names}, from the table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("| package | imports |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        package = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        said = re.sub(r"\([^)]*\)", "", cells[1])  # the reasons in parentheses are not read
        names = {n.split("/")[0].removesuffix(".py") for n in re.findall(r"`([\w./]+)`", said)}
        out[package] = names - {"nothing"}
    return out


def test_the_table_is_the_import_graph() -> None:
    doc, code = doc_imports(), code_imports()
    code = {k: v for k, v in code.items() if k != "__main__"}  # the entry point: `python -m`
    assert set(doc) >= set(code), f"packages with no row: {sorted(set(code) - set(doc))}"
    wrong = {
        p: {
            "imports, unsaid": sorted(code.get(p, set()) - doc[p]),
            "said, not imported": sorted(doc[p] - code.get(p, set())),
        }
        for p in doc
        if doc[p] != code.get(p, set())
    }
    assert wrong == {}


def test_the_check_reads_a_row() -> None:
    rows = doc_imports()
    assert rows["verification"] == {"model", "storage"}  # `storage/files.py` counts as storage
    assert rows["model"] == set()


def test_the_drawing_lists_the_floors_in_the_layers_order() -> None:
    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in layers["contracts"] if c["id"] == "layers"]
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text.split("## The drawing\n", 1)[1].split("```\n", 2)[1]
    floors = [
        " | ".join(p.strip().removesuffix("/").removesuffix(".py") for p in line[:25].split("|"))
        for line in drawing.splitlines()
    ]
    assert floors == contract["layers"]

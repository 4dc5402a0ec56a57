"""README stays true and short: its first two commands, the flags table generated from the options,
the test commands the CI script runs, the install lines, its links and its length."""

from __future__ import annotations

import re
from pathlib import Path

from tpload.options.flags import flags_markdown

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
MAX_LINES = 250  # README is for users; everything else belongs in docs/


def test_the_first_lines_are_the_two_commands() -> None:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block == [
        "pip install torch==2.13.0 && pip install -e . && torchrun --nproc-per-node 2 -m tpload",
        'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q',
    ]
    assert README.index("```bash\n") < 20  # the first thing a newcomer sees


def test_readme_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= MAX_LINES, "move detail into docs/ (README is for users)"


def test_the_flags_table_is_the_generated_one() -> None:
    # regenerate with: python -c "from tpload.options.flags import flags_markdown as f; print(f())"
    assert flags_markdown() in README


def test_ci_runs_readme_s_install_and_test_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q torch==2.13.0" in ci and 'pip install -q -e ".[test]"' in ci
    for command in ("python -m pytest -q", "python -m pytest -q -m slow"):
        assert command in ci and command in README
    assert "python -m pytest -q -m engine" in ci and "python -m pytest -q -m engine" in README


def test_user_docs_live_in_the_project() -> None:
    assert "../shared" not in README
    for doc in ("docs/format.md", "docs/threat-model.md"):
        assert (ROOT / doc).is_file() and doc in README


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (lower case, punctuation dropped, spaces to '-')."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    heads = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_local_link_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, anchor = target.partition("#")
            if "://" in target:
                continue
            dest = page.parent / path if path else page
            if not dest.exists() or (anchor and dest.is_file() and anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_install_lines_are_from_source_and_keep_the_engine_s_torch() -> None:
    keep_torch = (
        "pip install -e /path/to/tpload-clone -c "
        "<(python -c 'import torch; print(\"torch==\" + torch.__version__)')"
    )
    for doc in ("README.md", "docs/engines.md"):
        text = (ROOT / doc).read_text()
        # tpload is not on PyPI: no line may tell anyone to install it by name
        assert not re.search(r"^\s*pip install (tpload|\S+ tpload)\b", text, re.MULTILINE), doc
        assert keep_torch in text, doc
    assert "tpload is not on PyPI" in README

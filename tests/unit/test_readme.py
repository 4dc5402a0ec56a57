"""README stays true: its first two commands, the flags table generated from the options, and the CI
script running exactly README's test commands."""

from __future__ import annotations

from pathlib import Path

from tpload.options import flags_markdown

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def test_the_first_lines_are_the_two_commands() -> None:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block == [
        "pip install torch==2.13.0 && pip install -e . && torchrun --nproc-per-node 2 -m tpload",
        'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q',
    ]


def test_the_flags_table_is_the_generated_one() -> None:
    assert (
        flags_markdown() in README
    )  # regenerate with: python -c "from tpload.options import flags_markdown as f; print(f())"


def test_ci_runs_readme_s_test_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pip install -q -e ".[test]" && python -m pytest -q' in ci
    assert "python -m pytest -q -m slow" in ci and "python -m pytest -q -m slow" in README
    assert "python -m pytest -q -m engine" in ci and "python -m pytest -q -m engine" in README


def test_user_docs_live_in_the_project() -> None:
    assert "../shared" not in README
    for doc in ("docs/format.md", "docs/threat-model.md"):
        assert (ROOT / doc).is_file() and doc in README


def test_install_lines_are_from_source_and_keep_the_engine_s_torch() -> None:
    import re

    keep_torch = "pip install -e /path/to/tpload-clone -c <(python -c 'import torch; print(\"torch==\" + torch.__version__)')"
    for doc in ("README.md", "docs/engines.md"):
        text = (ROOT / doc).read_text()
        # tpload is not on PyPI: no line may tell anyone to install it by name
        assert not re.search(r"^\s*pip install (tpload|\S+ tpload)\b", text, re.MULTILINE), doc
        assert keep_torch in text, doc
    assert "tpload is not on PyPI" in README

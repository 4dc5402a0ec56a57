"""Untrusted names reach the terminal escaped: no ANSI sequence from a checkpoint reaches a
screen."""

from __future__ import annotations

from tpload.model.text import escape_name, printable


def test_control_characters_become_visible_escapes() -> None:
    forged = "w\x1b[2K\rload finished OK\x07"
    assert escape_name(forged) == "w\\x1b[2K\\x0dload finished OK\\x07"
    assert "\x1b" not in printable(f"tensor {forged}: bad")


def test_a_name_cannot_start_a_line_of_its_own() -> None:
    assert escape_name("a\nrank 0: OK") == "a\\x0arank 0: OK"
    assert (
        printable("line one\nline two") == "line one\nline two"
    )  # our own layout keeps its newlines


def test_printable_text_is_unchanged_including_unicode() -> None:
    assert printable("mtp.0.ffn.experts.3.w1.weight ✓") == "mtp.0.ffn.experts.3.w1.weight ✓"
    assert escape_name("\u200bzero-width") == "\\u200bzero-width"


def test_plural_counts_as_english_does() -> None:
    from tpload.model.text import plural

    assert [plural(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert plural(91_991, "tensor") == "91,991 tensors"
    assert [plural(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def test_a_layout_for_one_rank_is_worded_for_one_rank(small_ckpt) -> None:
    import pytest

    from tpload import LoadError, load

    with pytest.raises(LoadError) as e:
        load(small_ckpt, tp=2, progress=False)  # one process, no launcher: the API's words
    assert str(e.value) == (
        "load(tp=2) needs 2 ranks, one process each, but this process was not started by torchrun: "
        "run the script that calls load() with torchrun --nproc-per-node 2 SCRIPT.py (every "
        "process calls it alike), or pass group= a process group of 2 ranks; in this process "
        "alone, load() without tp"
    )
    assert "--tp" not in str(e.value)

"""Untrusted names reach the terminal escaped: no ANSI sequence from a checkpoint reaches a
screen."""

from __future__ import annotations

from tpload.text import escape_name, printable


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

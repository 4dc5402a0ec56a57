"""Text that reaches a terminal or a log: names and paths from a checkpoint are untrusted.

A tensor name or a shard path comes from files anyone may have written; printed
raw, an ANSI escape in a name could rewrite the operator's screen (forge "load
finished OK", hide an error line). Everything tpload prints or logs goes through
:func:`printable` once, at the edge where it is printed: control characters and
other non-printable code points become visible escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_KEEP = {"\n", "\t"}  # our own message layout; never inside a name (see escape_name)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character but newline and tab shown as an escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in _KEEP else _escape(ch) for ch in text)


def escape_name(name: object) -> str:
    """One untrusted name (tensor, file) for a message: everything non-printable escaped,
    newlines and tabs included, so a name cannot start a line of its own."""
    s = str(name)
    return s if s.isprintable() else "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and ``word``, in the plural unless ``count`` is 1 ("1 rank", "2 ranks"; ``many``:
    an irregular plural), the count with thousands separators ("91,991 tensors")."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def rank_ranges(ranks: Sequence[int]) -> str:
    """``0-3, 6, 8, 9``: a rank list, runs of three or more shortened (a cluster's nodes are
    runs)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(
        f"{a}-{b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))) for a, b in runs
    )


def first_line(e: BaseException) -> str:
    """An exception's first line, escaped and cut to 300 characters (its type's name if it has no
    text): what a one-line message quotes of a library's error."""
    text = str(e).strip().splitlines()
    return escape_name(text[0][:300]) if text else type(e).__name__


def one_line(e: BaseException) -> str:
    """An error in one line that names what failed (a refresh's row carries one line a rank): a
    many-problem error opens with a header ("1 problem(s):"), so its first problem is joined to it
    and the lines left are counted."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        head = f"{escape_name(lines[0])} {escape_name(lines[1].removeprefix('- '))[:300]}"
        rest = len(lines) - 2
        return head + (f" ({rest} line(s) more)" if rest else "")
    raw = str(e).splitlines()
    more = f" ({len(raw) - 1} line(s) more)" if len(raw) > 1 else ""
    # a line of tpload's own (a window's fingerprints and names) may run past first_line's 300
    return (escape_name(lines[0][:1000]) if lines else type(e).__name__) + more


def sha256_mismatch(
    path: Path | str, name: str, got: str, want: str, *, vouched_by: str | None = None
) -> str:
    """The one wording of a hash failure, wherever a tensor is checked against the manifest
    (``vouched_by``: what else vouched for ``want``, in words, when it was not the manifest)."""
    head = f"{escape_name(path)}: tensor {escape_name(name)}: sha256 {got[:16]}... does not match "
    if vouched_by is None:
        return head + f"the manifest's {want[:16]}..."
    return head + f"{want[:16]}..., {vouched_by}"

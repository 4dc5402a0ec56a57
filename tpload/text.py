"""Text that reaches a terminal or a log: names and paths from a checkpoint are untrusted.

A tensor name or a shard path comes from files anyone may have written; printed
raw, an ANSI escape in a name could rewrite the operator's screen (forge "load
finished OK", hide an error line). Everything tpload prints or logs goes through
:func:`printable` once, at the edge where it is printed: control characters and
other non-printable code points become visible escapes.
"""

from __future__ import annotations

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

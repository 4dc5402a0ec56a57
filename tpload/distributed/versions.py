"""Which tpload each rank runs, compared before any collective.

The handshake and the exchange are all-reduces of fixed rows; gloo aborts the process (SIGABRT,
"Received data size doesn't match expected size") when a peer's row is another length, as a peer
of another tpload's may be. So before the first collective every rank leaves its stamp (its
tpload version and the handshake row's format) in the rendezvous store, in the step where it
leaves its node name (exchange.py's ``share_nodes``), and reads every peer's there: a peer of
another version, or one that left none (a tpload from before the stamp), is named on every rank
that sees it, and no rank that sees one enters a collective (:class:`Incompatible`). The stamp is
written before the node name, so a peer whose node name is in the store has its stamp there too.

The handshake row itself leads with a fixed header (:data:`MAGIC`, :data:`FORMAT`, its length in
words), checked before the row is used (agreement.py): a row of another format that reached the
table anyway is named, never read as terms.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model.errors import LoadError
from ..model.text import escape_name, rank_ranges

MAGIC = int.from_bytes(b"tpldhand", "little", signed=True)
"""The handshake row's first word."""
FORMAT = 3
"""The handshake row's format (1: the rows before the header, which carried none; 2: before the
signature had a term of its own)."""


class Incompatible(LoadError):
    """The ranks run different tploads: no collective may follow (rows of another length abort
    gloo), so the rank that raises it skips the handshake and the exchange."""


def stamp() -> str:
    """This rank's tpload: its version (read at each call: the package's attribute) and the
    handshake row's format."""
    from .. import __version__

    return f"tpload {__version__}, handshake row format {FORMAT}"


def mismatch(rank: int, stamps: Sequence[str | None]) -> Incompatible | None:
    """The error naming every rank whose stamp differs from ``rank``'s own (None: it left no
    stamp), or None when every rank runs this tpload. ``stamps``: every rank's, by rank."""
    mine = stamps[rank]
    if all(s == mine for s in stamps):
        return None
    sides: dict[str | None, list[int]] = {}
    for r, s in enumerate(stamps):
        sides.setdefault(s, []).append(r)
    said = "; ".join(
        f"rank {rank_ranges(who)}: "
        + (f"'{escape_name(s)}'" if s is not None else "no version (a tpload older than this one)")
        for s, who in sides.items()
    )
    return Incompatible(
        f"rank {rank}: the ranks run different tploads ({said}); every rank must run the same "
        "tpload: install one version on every node (`python -m tpload --version` on each)"
    )

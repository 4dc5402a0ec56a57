"""What an engine read of a handed tensor: element ranges whose union covers what the rank held."""

from __future__ import annotations

from tpload.integrations.handed import _covers


def test_coverage_of_element_ranges_by_parts() -> None:
    held = ((0, 4), (0, 6))
    assert _covers(held, [((0, 4), (0, 6))])
    assert _covers(held, [((0, 2), (0, 6)), ((2, 4), (0, 3)), ((1, 4), (3, 6))])
    assert not _covers(
        held, [((0, 2), (0, 6)), ((2, 4), (0, 3)), ((2, 3), (3, 6))]
    )  # [3:4, 3:6] unread
    assert _covers(held, [((0, 1), (0, 6)), ((1, 2), (0, 6)), ((2, 3), (0, 6)), ((3, 4), (0, 6))])
    assert not _covers(held, [])
    assert _covers((), [()])  # a 0-d tensor read

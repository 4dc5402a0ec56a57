"""Fingerprints of stacked windows: a rank reads a gpt-oss expert tensor's window as view rows
(experts x rows, each a piece of a served row) and fingerprints them grouped; the same window
served as a tensor and fingerprinted by the device path (torch ops, as on a GPU) must give the
same triple, or CPU and GPU digests of one layout would differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.kernels.fingerprint import DeviceFingerprint, HostFingerprint, as_bytes2d, fingerprint
from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published

from ...formats_reference import read_all

pytestmark = pytest.mark.usefixtures("implementation")  # numba's kernels, then ahead-of-time


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("oss") / "g", "gpt-oss-tiny")


def windows(root: Path, layout: Layout, rank: int) -> list[tuple[object, np.ndarray]]:
    """Each stacked cut of the rank's plan with its stored bytes in the cut's own 2-D view."""
    planner = planner_of(read_native(root)[0], load_config("gpt-oss"))
    arrays = read_all(root)[0]
    out = []
    for item in planner.plan(layout, "packed", rank).items:
        for cut in item.cuts:
            if ".experts." in cut.name:
                view = (
                    arrays[cut.name].reshape(-1).view(np.uint8).copy().reshape(cut.view)
                )  # writable, as staging is
                out.append((cut, view[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]))
    return out


def device_triple(served: torch.Tensor) -> tuple[int, int, int]:
    b = as_bytes2d(served)
    device = DeviceFingerprint(b.shape[1], torch.device("cpu"))
    device.add(b, 0)
    return tuple(int(v) for v in device.value())


def host_triple(window: np.ndarray, piece_bytes: int, group: int) -> tuple[int, int, int]:
    """What the copy path takes for the served tensor: the grouped pass over the view rows as the
    reader streams them (two blocks), or, where pieces would split words, the served view itself."""
    if not HostFingerprint.fits(piece_bytes, group):
        return fingerprint(torch.from_numpy(window.reshape(window.shape[0] // group, -1)))
    host = HostFingerprint(piece_bytes, group=group)
    half = window.shape[0] // 2 // group * group or window.shape[0]
    host.add(window[:half], 0)
    host.add(window[half:], half)
    return host.value()


@pytest.mark.parametrize("tp,ep,rank", [(2, 1, 1), (4, 1, 3), (2, 2, 3)])
def test_a_stacked_window_fingerprints_alike_on_host_and_device(
    gpt_oss: Path, tp: int, ep: int, rank: int
) -> None:
    cuts = windows(gpt_oss, Layout(tp, ep), rank)
    assert any(cut.group > 1 for cut, _ in cuts)  # the down_proj cuts really are read in pieces
    for cut, window in cuts:
        served = torch.from_numpy(np.ascontiguousarray(window)).reshape(
            cut.shape[0], -1
        )  # [experts, ...]
        assert host_triple(window, cut.row_bytes, cut.group) == device_triple(served), cut.name


@pytest.mark.parametrize("piece_bytes,group", [(368, 2880), (16, 7), (24, 3), (5, 4), (2, 256)])
def test_grouped_pieces_fingerprint_as_the_served_rows(piece_bytes: int, group: int) -> None:
    """gpt-oss-120b's down_proj at tp 4 is 368-byte pieces of 2880-piece rows: grouped in place;
    pieces that would split words take the served view instead. Either way, the device's triple."""
    rng = np.random.default_rng(piece_bytes * group)
    window = rng.integers(0, 256, (3 * group, piece_bytes), dtype=np.uint8)
    served = torch.from_numpy(window.copy()).reshape(3, -1)
    assert host_triple(window, piece_bytes, group) == device_triple(served)

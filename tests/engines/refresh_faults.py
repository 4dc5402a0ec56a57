"""Faults planted in a trainer rank's transfer for tests/engines/refresh_driver.py: on the wire, not
in the trainer's tensors, so the version manifest is honest and the bytes sent are not."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

from tpload.refresh.rendezvous import Frame, TransferGroup
from tpload.refresh.trainer import RefreshSender

CONTROL = Frame.CONTROL
_CUT = RefreshSender._cut
_ISEND = TransferGroup.isend


def plant(kind: str, rank: int, *, flipped: str) -> None:
    """This round's fault on this trainer rank (anything but these two: none).

    ``flipped byte``: one bit of ``flipped``'s window for engine rank 0 flips after the sender
    fingerprinted it (on whichever trainer rank sends that tensor). ``trainer killed``: trainer
    rank 1 kills itself (SIGKILL) as it posts its third window chunk."""
    RefreshSender._cut, TransferGroup.isend = _CUT, _ISEND
    if kind == "flipped byte":

        def flipping(self, cutting, storage, owned):  # noqa: ANN001
            part, windows = _CUT(self, cutting, storage, owned)
            names = [n for n, _, _ in cutting.windows(0) if n in owned]
            if flipped in names:
                i = names.index(flipped)
                w = windows[0][i].copy()
                w.view("uint8")[0] ^= 1
                windows[0][i] = w
            return part, windows

        RefreshSender._cut = flipping
    elif kind == "trainer killed" and rank == 1:
        posted = []

        def dying(self, t, peer):  # noqa: ANN001
            if peer >= self.rv.trainer_ranks:
                posted.append(peer)
                if len(posted) == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
            return _ISEND(self, t, peer)

        TransferGroup.isend = dying


def digests(figures: object) -> list[str] | None:
    return list(figures.digests) if figures is not None else None


def write_checkpoint(model: Path, tensors: dict, folder: Path) -> Path:
    """``tensors`` as a one-file checkpoint beside ``model``'s config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(model / "config.json", folder / "config.json")
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""Faults planted in a trainer rank's transfer for tests/engines/refresh_driver.py: the wire, not
the trainer's tensors, so the version manifest is honest and the windows are not."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

from tpload.refresh.rendezvous import TransferGroup

_SEND = TransferGroup.send


def plant(kind: str, rank: int, *, flipped: str) -> None:
    """This round's fault on this trainer rank: ``flipped byte`` flips one bit of the first chunk
    of ``flipped``'s window sent to engine rank 0 (by whichever trainer rank holds it); ``trainer
    killed`` kills trainer rank 1 (SIGKILL) after its second window chunk; anything else: none."""
    TransferGroup.send = _SEND
    if kind == "flipped byte":
        done = []

        def flipping(self, t, peer, what):  # noqa: ANN001
            if not done and flipped in what and peer == self.rv.trainer_ranks:
                t = t.clone()
                t.reshape(-1).view(dtype=__import__("torch").uint8)[0] ^= 1
                done.append(what)
            return _SEND(self, t, peer, what)

        TransferGroup.send = flipping
    elif kind == "trainer killed" and rank == 1:
        sent = []

        def dying(self, t, peer, what):  # noqa: ANN001
            if peer >= self.rv.trainer_ranks and "window" in what:
                sent.append(what)
                if len(sent) == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
            return _SEND(self, t, peer, what)

        TransferGroup.send = dying


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

"""Run under torchrun with 2 ranks (gloo): one family of attacks on the verified refresh, one
launch a family. Global rank 0 is the trainer (one trainer rank), global rank 1 the engine (one
engine rank, tp 1: a dict of parameters committed after each verdict). Every family ends with a
good round, so a family passes only if the engine process is alive, its old weights kept, and
still serving.

Families (argv FAMILY):

* ``frames``: a trainer that does not keep to its own chunk size (a chunk larger than the engine
  posted), then one that sends a control frame where a window's chunk is due;
* ``calls``: two ``send()`` calls at once on one sender, ``start()`` again mid-round (a second
  ``start_weight_update``), and ``receive()`` after the verdict;
* ``junk``: a manifest of junk bytes (an ANSI escape first) signed by another key, where the engine
  takes sha256 manifests signed by the trainer's key; then 32 MiB of junk announced as a manifest;
* ``members``: a trainer that joins and then stalls (never sends its round), then one that leaves
  the transfer group mid-update.

A lost group is met the way an engine meets it: a new rendezvous for the next round. argv: FAMILY
V1_DIR V2_DIR KEY PUB OUT_DIR. Each rank writes OUT_DIR/rank{R}.json: {case: {"error": the one
line or "", "s": seconds, and on the engine "served", "rss_mib" (growth over the round), "same"
(whether the parameters are the expected version's)}}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from tests.ckpt_tools import whole
from tpload.refresh.engine import RefreshReceiver
from tpload.refresh.layout import EngineLayout
from tpload.refresh.manifest import sign_bytes
from tpload.refresh.rendezvous import Rendezvous
from tpload.refresh.tensors import entry_of
from tpload.refresh.terms import RefreshCheck, RefreshError
from tpload.refresh.trainer import RefreshSender
from tpload.selection.config import load_config

TIMEOUT_S = 3.0  # the stalled member's bound is this + 5 s


class Attacker(RefreshSender):
    """A trainer that runs modified code: ``mode`` says what it does wrong in its next round."""

    mode = ""
    junk_key: Path | None = None

    def _send_windows(self, group, windows) -> int:  # noqa: ANN001
        mode, self.mode = self.mode, ""
        if mode == "oversized":  # its own chunk size, tripled: more than the engine posted
            self.chunk_bytes, keep = self.chunk_bytes * 3, self.chunk_bytes
            try:
                return super()._send_windows(group, windows)
            finally:
                self.chunk_bytes = keep
        if mode == "control":  # a control frame where a window's chunk is due
            group.send_bytes(b"not a window", self._engine(0), "a stray frame")
            return 0
        if mode == "leave":  # gone mid-update: its links closed under the engine
            self.close()
            raise RefreshError("this trainer left mid-update")
        if mode == "concurrent":  # a second send() from another thread while this one runs
            t = threading.Thread(target=self._again)
            t.start()
            t.join(60)
        return super()._send_windows(group, windows)

    second = "the second call did not run"

    def _again(self) -> None:
        try:
            self.send({}, version=1)
            self.second = ""
        except RefreshError as e:
            self.second = str(e)

    def _manifest(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        m = super()._manifest(*args, **kwargs)
        if self.mode in ("junk", "huge"):
            return Junk(m, self.junk_key, 30_000 if self.mode == "junk" else 32 << 20)
        return m

    def send(self, source, *, version):  # noqa: ANN001, ANN201
        if self.mode == "stall":  # joined, then never sends its round
            self.mode = ""
            time.sleep(TIMEOUT_S + 0.5)  # past the engine's timeout
            raise RefreshError("this trainer stalled")
        return super().send(source, version=version)


class Junk:
    """A manifest of junk bytes, signed by another key."""

    def __init__(self, manifest, key: Path | None, size: int) -> None:  # noqa: ANN001
        self.ranks, self.key, self.size = manifest.ranks, key, size

    def to_bytes(self) -> bytes:
        return b"\x1b[2J" + b"j" * self.size

    def sign(self, key) -> bytes:  # noqa: ANN001
        return sign_bytes(self.to_bytes(), self.key)


def share_rv(rv: Rendezvous | None) -> Rendezvous:
    """The trainer's rendezvous handed to the engine (over the world: what an engine's init call
    carries)."""
    box = [rv.to_json() if rv is not None else None]
    dist.broadcast_object_list(box, src=0)
    return Rendezvous.from_json(box[0])


def trainer(family: str, v: dict[int, dict], key: str) -> dict:
    # small chunks: the tiny model's windows span several (a chunk's size is the protocol's)
    sender = Attacker(rank=0, trainer_ranks=1, timeout_s=TIMEOUT_S, chunk_bytes=1024)
    if family == "junk":
        sender.check, sender.signer_key = RefreshCheck.SHA256, key
        sender.junk_key = Path(key).with_name("other.pem")
    said: dict[str, dict] = {}

    def connect() -> None:
        sender.connect(share_rv(sender.rendezvous(engine_ranks=1)))

    connect()
    for case, version, attack in CASES[family]:
        t0 = time.monotonic()
        sender.mode = attack
        try:
            sender.send(v[version], version=version)
            said[case] = {"error": ""}
        except RefreshError as e:
            said[case] = {"error": str(e)}
        said[case]["s"] = time.monotonic() - t0
        if attack == "concurrent":
            said[case]["second"] = sender.second
        if attack == "leave":  # a new sender, as a restarted trainer
            sender = Attacker(rank=0, trainer_ranks=1, timeout_s=TIMEOUT_S)
        dist.barrier()
        if attack in BREAKS:  # the group is gone: the engine is given a new rendezvous
            connect()
    sender.close()
    return said


def engine(family: str, v: dict[int, dict], root: str, pub: str) -> dict:
    cfg = load_config("llama")
    model = json.loads((Path(root) / "config.json").read_text())
    layout = EngineLayout(cfg.id(), 1, 1, "packed", 1, config="llama", model=model)
    table = {n: (e.dtype, e.shape) for n, e in ((n, entry_of(n, t)) for n, t in v[1].items())}
    recv = RefreshReceiver(
        rank=0, world=1, exchange_group=None, layout=layout, config=cfg,
        device=torch.device("cpu"), table=table, timeout_s=TIMEOUT_S,
    )  # fmt: skip
    if family == "junk":
        recv.check, recv.public_key = RefreshCheck.SHA256, pub
    params = {n: torch.zeros_like(t) for n, t in v[1].items()}  # version 0
    proc = psutil.Process()
    said: dict[str, dict] = {}
    recv.connect(share_rv(None))
    for case, _, attack in CASES[family]:
        rss = proc.memory_info().rss
        t0 = time.monotonic()
        try:
            recv.start()
            if case == "restart":  # start_weight_update again once the round is under way
                recv.receive(final=False, windows=1)
                said[case] = {"second_start": refused_call(recv.start)}
            recv.receive(final=True)
            if case == "restart":  # update_weights again once the verdict passed
                said[case]["late_receive"] = refused_call(lambda: recv.receive(final=True))
            for name, t in recv.windows():
                params[name].copy_(t)  # the commit: only after the verdict
            recv.committed(recv.version)
            said.setdefault(case, {})["error"] = ""
            if case == "restart":  # and once it is served, before a new start_weight_update
                said[case]["unopened"] = refused_call(lambda: recv.receive(final=True))
        except RefreshError as e:
            said.setdefault(case, {})["error"] = str(e)
        said[case]["s"] = time.monotonic() - t0
        said[case]["rss_mib"] = (proc.memory_info().rss - rss) / (1 << 20)
        said[case]["served"] = recv.served_version
        want = v.get(recv.served_version)
        said[case]["same"] = all(
            torch.equal(params[n], want[n] if want is not None else torch.zeros_like(params[n]))
            for n in params
        )
        dist.barrier()
        if attack in BREAKS:
            recv.connect(share_rv(None))
    recv.close()
    return said


def refused_call(call: Callable[[], object]) -> str:
    """What a call out of order raised ("" if it was taken)."""
    t0 = time.monotonic()
    try:
        call()
        return ""
    except RefreshError as e:
        return f"{e} ({time.monotonic() - t0:.1f} s)"


CASES: dict[str, list[tuple[str, int, str]]] = {  # (case, version, what the trainer does wrong)
    "frames": [("v1", 1, ""), ("oversized", 2, "oversized"), ("control", 2, "control"),
               ("v2", 2, "")],
    "calls": [("concurrent", 1, "concurrent"), ("restart", 2, ""), ("v3", 3, "")],
    "junk": [("junk", 1, "junk"), ("huge", 1, "huge"), ("v1", 1, "")],
    "members": [("v1", 1, ""), ("stall", 2, "stall"), ("leave", 2, "leave"), ("v2", 2, "")],
}  # fmt: skip
BREAKS = {"oversized", "control", "junk", "huge", "stall", "leave"}
"""The attacks after which the transfer group is gone on both sides."""


def main() -> None:
    family, v1_dir, v2_dir, key, pub, out = sys.argv[1:7]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    v = {1: whole(Path(v1_dir)), 2: whole(Path(v2_dir))}
    v[3] = {n: t.clone() for n, t in v[1].items()}  # a third version: v1's weights again
    run: Callable[[], dict] = (
        (lambda: trainer(family, v, key)) if rank == 0 else (lambda: engine(family, v, v1_dir, pub))
    )
    said = run()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(said, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

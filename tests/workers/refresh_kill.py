"""Run under torchrun with 4 ranks (gloo): a trainer rank killed mid-update (SIGKILL, what the OOM
killer does), then a new trainer serving the next version. Global ranks 0 and 1 are the trainer
ranks, 2 and 3 the engine ranks (a stand-in engine at tp 2, as tests/workers/refresh.py's):

1. version 1 from both trainer ranks: served;
2. version 2: trainer rank 1 sends its first window to each engine rank and kills itself. Both
   engine ranks must refuse the round with the same line naming the lost trainer rank, in bounded
   time, and keep version 1; trainer rank 0's send must fail, never hang;
3. trainer rank 0 alone (a new sender: one trainer rank) opens a new rendezvous, written to
   OUT_DIR/rv3.json (the world's collectives are gone with the dead rank), and serves version 3.

torchrun SIGTERMs the survivors once a rank dies: they ignore it (its later SIGKILL still bounds
them). argv: V1_DIR V2_DIR OUT_DIR. Each survivor writes OUT_DIR/rank{R}.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

import tpload
from tpload.refresh.engine import RefreshReceiver
from tpload.refresh.layout import EngineLayout
from tpload.refresh.rendezvous import Rendezvous
from tpload.refresh.terms import RefreshError
from tpload.refresh.trainer import RefreshSender
from tpload.selection.config import load_config

TRAINERS, ENGINES = 2, 2
TIMEOUT_S = 30.0


def tensors(root: str) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(Path(root).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})  # noqa: SIM118 - no mapping
    return out


class Dying(RefreshSender):
    """Sends the first window to each engine rank, then dies (in the round after ``die`` is set)."""

    die = False

    def _send_windows(self, group, windows) -> int:  # noqa: ANN001
        if not self.die:
            return super()._send_windows(group, windows)
        super()._send_windows(group, {e: ws[:1] for e, ws in windows.items()})
        os.kill(os.getpid(), signal.SIGKILL)
        return 0


def trainer(rank: int, argv: list[str], out: Path, sender: Dying, rv: Rendezvous) -> dict:
    v1, v2 = tensors(argv[0]), tensors(argv[1])
    sender.connect(rv)
    said = {"v1": _send(sender, v1, 1)}
    dist.barrier()  # the last collective of the world: rank 1 dies in the next round
    sender.die = rank == 1
    started = time.monotonic()
    said["killed"] = _send(sender, v2, 2)
    said["killed"]["seconds"] = time.monotonic() - started
    sender.close()
    alone = RefreshSender(rank=0, trainer_ranks=1, timeout_s=TIMEOUT_S)
    rv3 = alone.rendezvous(engine_ranks=ENGINES)
    (out / "rv3.tmp").write_text(rv3.to_json())
    (out / "rv3.tmp").rename(out / "rv3.json")
    alone.connect(rv3)
    said["v3"] = _send(alone, v2, 3)
    alone.close()
    return said


def _send(sender: RefreshSender, weights: dict, version: int) -> dict:
    try:
        sender.send(weights, version=version)
        return {"error": ""}
    except RefreshError as e:
        return {"error": str(e)}


def engine(rank: int, argv: list[str], out: Path, rv: Rendezvous, group) -> dict:
    v1_dir, v2_dir = argv[0], argv[1]
    cfg = load_config("llama")
    model = json.loads((Path(v1_dir) / "config.json").read_text())
    layout = EngineLayout(cfg.id(), 2, 1, "packed", ENGINES, config="llama", model=model)
    expected = {
        v: tpload.load(d, group=group, cpu_group=group, tp=2, config="llama").state_dict()
        for v, d in (("v1", v1_dir), ("v2", v2_dir))
    }
    params = {n: torch.zeros_like(t) for n, t in expected["v1"].items()}
    recv = RefreshReceiver(
        rank=rank, world=ENGINES, exchange_group=group, layout=layout, config=cfg,
        device=torch.device("cpu"), timeout_s=TIMEOUT_S,
    )  # fmt: skip
    recv.connect(rv)
    said = {}
    for case, want in (("v1", "v1"), ("killed", "v1"), ("v3", "v2")):
        if case == "v3":
            recv.connect(_wait_rv3(out))
        else:
            recv.timeout_s = TIMEOUT_S
        if case == "killed":
            dist.barrier()
        started = time.monotonic()
        recv.start()
        try:
            recv.receive(final=True)
            for name, t in recv.windows():
                params[name].copy_(t)
            recv.committed(recv.version)
            said[case] = {"error": ""}
        except RefreshError as e:
            said[case] = {"error": str(e)}
        said[case]["seconds"] = time.monotonic() - started
        said[case]["served"] = recv.served_version
        said[case]["same"] = all(torch.equal(params[n], expected[want][n]) for n in params)
    recv.close()
    return said


def _wait_rv3(out: Path) -> Rendezvous:
    path = out / "rv3.json"
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no rendezvous for version 3")
        time.sleep(0.05)
    return Rendezvous.from_json(path.read_text())


def main() -> None:
    argv, out = sys.argv[1:3], Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank != 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's, once rank 1 is gone
    trainers = dist.new_group(list(range(TRAINERS)))
    engines = dist.new_group(list(range(TRAINERS, TRAINERS + ENGINES)))
    if rank < TRAINERS:
        sender = Dying(
            rank=rank, trainer_ranks=TRAINERS, trainer_group=trainers, timeout_s=TIMEOUT_S
        )
        rv = sender.rendezvous(engine_ranks=ENGINES)
        box = [rv.to_json()]
        dist.broadcast_object_list(box, src=0)
        said = trainer(rank, argv, out, sender, rv)
    else:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        said = engine(rank - TRAINERS, argv, out, Rendezvous.from_json(box[0]), engines)
    (out / f"rank{rank}.json").write_text(json.dumps(said, indent=1))
    os._exit(0)  # the world holds a dead rank: no teardown waits on it


if __name__ == "__main__":
    main()

"""Run under torchrun with 4 ranks (gloo): a verified refresh from 2 trainer ranks (global ranks 0
and 1) into a stand-in engine of 2 engine ranks (global ranks 2 and 3, tp 2), one round after
another in one world:

* ``v1``: version 1, the weights of V1_DIR: accepted; each engine rank's digest must equal
  ``tpload.load``'s of V1_DIR at tp 2 (made here, on the engine ranks' own group), and its
  parameters the load's tensors;
* ``flipped``: version 2, one byte of one window flipped by trainer rank 1 after its fingerprints
  were taken (a fault in transit): refused;
* ``missing``: version 2 without one tensor: refused;
* ``old``: version 1 again (V2_DIR's weights): refused, not newer than the served version;
* ``raising``: version 2, trainer rank 1's source raises mid-iteration (its process lives): every
  rank fails within seconds with its cause;
* ``v2``: version 2, V2_DIR's weights, at sha256 strength with a signed manifest: accepted, the
  digests and parameters are V2_DIR's.

The engine is a dict of parameters (this rank's windows, as tpload.load serves them), committed by
copying the verified windows into them. argv: V1_DIR V2_DIR KEY PUB OUT_DIR. Each rank writes
OUT_DIR/rank{R}.json: {case: {"error": the one line or "", "digest": ..., "same": whether the
parameters equal the expected load's}}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

import tpload
from tpload.refresh import rendezvous
from tpload.refresh.engine import RefreshReceiver
from tpload.refresh.layout import EngineLayout
from tpload.refresh.rendezvous import Rendezvous
from tpload.refresh.terms import RefreshCheck, RefreshError
from tpload.refresh.trainer import RefreshSender
from tpload.selection.config import load_config

TRAINERS, ENGINES = 2, 2
MISSING = "model.layers.1.mlp.down_proj.weight"
FLIPPED = "model.layers.0.self_attn.q_proj.weight"  # split by heads: rank 1's window is its half


def tensors(root: str) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(Path(root).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})  # noqa: SIM118 - no mapping
    return out


class Source:
    """vLLM's WeightSource shape: this rank holds every other name (and both hold the norms)."""

    def __init__(self, weights: dict[str, torch.Tensor], rank: int) -> None:
        names = sorted(weights)
        self.weights = weights
        self.held = {n for i, n in enumerate(names) if i % TRAINERS == rank or "norm" in n}

    def held_names(self) -> set[str]:
        return self.held

    def __iter__(self):
        for name in sorted(self.weights):
            yield name, self.weights[name] if name in self.held else None


class Raising(Source):
    """A source that breaks while it is read (a trainer's bug), its process still alive."""

    def __iter__(self):
        yield from list(super().__iter__())[:3]
        raise RuntimeError("the source broke")


class Faulty(RefreshSender):
    """Flips one byte of one window (after its fingerprint and the manifest were made) in the round
    after ``flip`` is set."""

    flip = False

    def _send_windows(self, group, windows):
        if self.flip and self.rank == 1:
            self.flip = False
            e, k = next((e, k) for e, ws in windows.items() for k, w in enumerate(ws) if w.size)
            w = windows[e][k].copy()
            w[w.size // 2] ^= 0x10
            windows[e][k] = w
        return super()._send_windows(group, windows)


def trainer(rank: int, argv: list[str], sender: Faulty, rv: Rendezvous, group) -> dict:
    v1, v2, key = tensors(argv[0]), tensors(argv[1]), argv[2]
    said = {}
    sender.connect(rv)
    rounds = [
        ("v1", v1, 1),
        ("flipped", v2, 2),
        ("missing", {n: t for n, t in v2.items() if n != MISSING}, 2),
        ("old", v2, 1),
        ("raising", v2, 2),
        ("v2", v2, 2),
    ]
    for case, weights, version in rounds:
        sender.flip = case == "flipped"
        if case == "v2":  # a new sender, as after a trainer restart: a new rendezvous
            sender.close()
            sender = Faulty(
                rank=rank, trainer_ranks=TRAINERS, trainer_group=group,
                check=RefreshCheck.SHA256, signer_key=key,
            )  # fmt: skip
            sender.connect(_next_rv(rank, sender, group))
        source = Source(weights, rank) if case != "missing" else weights
        if case == "raising" and rank == 1:
            source = Raising(weights, rank)
        try:
            figures = sender.send(source, version=version)
            said[case] = {"error": "", "digests": list(figures.digests), "s": figures.seconds}
        except RefreshError as e:
            said[case] = {"error": str(e)}
        dist.barrier()
    sender.close()
    return said


def _next_rv(rank: int, sender: RefreshSender, group) -> Rendezvous:
    """A new rendezvous (the trainer re-inits the engine's transfer: a new connect), shared with
    the engine ranks over the world."""
    rv = sender.rendezvous(engine_ranks=ENGINES)
    _announce(rank, rv)
    box = [rv.to_json()]
    dist.broadcast_object_list(box, src=0)
    return rv


def _announce(rank: int, rv: Rendezvous) -> None:
    """Trainer rank 0 says where the hub listens, and waits a moment, only so the test's stranger
    (a process of the host that found the port) is at it before any member arrives."""
    if rank == 0 and OUT is not None:
        (OUT / f"hub-{rv.port}.port").write_text(str(rv.port))
        time.sleep(1.0)


_LISTENER = rendezvous._Forming._listener


def _listener(self):  # noqa: ANN001, ANN202
    """A member's own listener, announced the same way (a stranger scanning the host finds it)."""
    s = _LISTENER(self)
    if OUT is not None:
        port = s.getsockname()[1]
        (OUT / f"member-{port}.port").write_text(str(port))
        time.sleep(0.5)
    return s


rendezvous._Forming._listener = _listener


def engine(rank: int, argv: list[str], rv: Rendezvous, group) -> dict:
    v1_dir, v2_dir, pub = argv[0], argv[1], argv[3]
    cfg = load_config("llama")
    model = json.loads((Path(v1_dir) / "config.json").read_text())
    layout = EngineLayout(cfg.id(), 2, 1, "packed", ENGINES, config="llama", model=model)
    expected = {
        v: tpload.load(d, group=group, cpu_group=group, tp=2, config="llama")
        for v, d in (("v1", v1_dir), ("v2", v2_dir))
    }
    # the stand-in engine: version 0 is v1's own weights with every element negated (the same
    # shapes; what a version 1 must replace everywhere)
    params = {n: -t.clone() for n, t in expected["v1"].state_dict().items()}
    table = {n: (m["dtype"], tuple(m["shape"])) for n, m in _table(v1_dir).items()}
    recv = RefreshReceiver(
        rank=rank, world=ENGINES, exchange_group=group, layout=layout, config=cfg,
        device=torch.device("cpu"), table=table, staging_budget_bytes=1 << 30,
    )  # fmt: skip
    recv.connect(rv)
    said = {}
    current = -expected["v1"].state_dict()[FLIPPED]
    for case in ("v1", "flipped", "missing", "old", "raising", "v2"):
        if case == "v2":
            recv.check, recv.public_key = RefreshCheck.SHA256, pub
            recv.connect(_next_engine_rv())
        t0 = time.perf_counter()
        recv.start()
        try:
            recv.receive(final=True)
            for name, t in recv.windows():
                params[name].copy_(t)  # the commit: only after the verdict
            recv.committed(recv.version)
            current = params[FLIPPED].clone()
            said[case] = {"error": "", "digest": recv.figures.digests[0]}
        except RefreshError as e:
            said[case] = {"error": str(e), "served": recv.served_version}
        load = expected["v2" if case == "v2" else "v1"]
        want = load.state_dict()
        said[case]["s"] = time.perf_counter() - t0
        said[case]["same"] = all(torch.equal(params[n], want[n]) for n in want)
        said[case]["kept"] = bool(torch.equal(params[FLIPPED], current))
        said[case]["load_digest"] = load.report.ranks[rank].digest
        dist.barrier()
    recv.close()
    return said


def _next_engine_rv() -> Rendezvous:
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return Rendezvous.from_json(box[0])


def _table(root: str) -> dict:
    return json.loads((Path(root) / "NATIVE_MANIFEST.json").read_text())["tensors"]


OUT: Path | None = None


def main() -> None:
    global OUT
    argv, out = sys.argv[1:5], Path(sys.argv[5])
    OUT = out
    (out / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainers = dist.new_group(list(range(TRAINERS)))
    engines = dist.new_group(list(range(TRAINERS, TRAINERS + ENGINES)))
    if rank < TRAINERS:
        sender = Faulty(rank=rank, trainer_ranks=TRAINERS, trainer_group=trainers)
        rv = sender.rendezvous(engine_ranks=ENGINES)
        _announce(rank, rv)
        box = [rv.to_json()]
        dist.broadcast_object_list(box, src=0)
        said = trainer(rank, argv, sender, rv, trainers)
    else:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        said = engine(rank - TRAINERS, argv, Rendezvous.from_json(box[0]), engines)
    (out / f"rank{rank}.json").write_text(json.dumps(said, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

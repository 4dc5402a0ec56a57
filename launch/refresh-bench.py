"""The verified refresh against a plain gloo broadcast among the same processes (issue 30's bench).

    python launch/refresh-bench.py [--layers 4] [--hidden 1024] [--inter 2816] [--vocab 16000]
                                   [--rounds 3] [--chunk-mib 8] [--out FILE.json]

One torchrun launch of 4 ranks (gloo, CPU): 2 trainer ranks holding the same llama-shaped bf16
weights (random, the sizes above) and 2 engine ranks (the llama config, tp 2). Each measured round
starts after a barrier of all four and ends when the last rank is done; per round, in turn:

* ``broadcast``: trainer rank 0 broadcasts every full tensor, one after another, to every rank
  over gloo (what an unchecked push does: each engine rank gets every whole tensor);
* ``refresh``: a verified refresh at the default strength (fingerprint): the two trainer ranks
  plan, fingerprint and send each engine rank its windows; the round ends when every engine rank
  has staged and checked them (the verdict; nothing is committed into a model);
* ``refresh-sha256``: the same at sha256 strength;
* ``refresh-no-nan-check``: ``refresh`` with the engine's non-finite check off
  (``allow_nonfinite``): the check's cost is the difference.

Every manifest is signed (the engine holds the public key): a signature costs milliseconds.

It prints each arm's median seconds over ``--rounds`` (after one warm-up round each), the refresh
arms' ratio to the broadcast (issue 30's target: at most 1.25 at the default strength), and each
arm's bytes on the wire.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINERS, ENGINES = 2, 2


def weights(a: argparse.Namespace) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    h, heads = a.hidden, a.hidden // 64

    def t(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": t(a.vocab, h), "lm_head.weight": t(a.vocab, h)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": t(h),
            p + "post_attention_layernorm.weight": t(h),
            p + "self_attn.q_proj.weight": t(heads * 64, h),
            p + "self_attn.k_proj.weight": t(heads * 64, h),
            p + "self_attn.v_proj.weight": t(heads * 64, h),
            p + "self_attn.o_proj.weight": t(h, heads * 64),
            p + "mlp.gate_proj.weight": t(a.inter, h),
            p + "mlp.up_proj.weight": t(a.inter, h),
            p + "mlp.down_proj.weight": t(h, a.inter),
        }
    out["model.norm.weight"] = t(h)
    return out


def model_config(a: argparse.Namespace) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": a.hidden,
        "intermediate_size": a.inter,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.hidden // 64,
        "num_key_value_heads": a.hidden // 64,
        "head_dim": 64,
        "vocab_size": a.vocab,
    }


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from tpload.refresh import (
        EngineLayout,
        RefreshCheck,
        RefreshReceiver,
        RefreshSender,
        Rendezvous,
    )
    from tpload.selection.config import load_config

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainers = dist.new_group(list(range(TRAINERS)))
    engines = dist.new_group(list(range(TRAINERS, TRAINERS + ENGINES)))
    w = weights(a)
    is_trainer = rank < TRAINERS
    box: list = [None]
    if is_trainer:
        sender = RefreshSender(
            rank=rank, trainer_ranks=TRAINERS, trainer_group=trainers,
            chunk_bytes=a.chunk_mib << 20, signer_key=a.key,
        )  # fmt: skip
        rv = sender.rendezvous(engine_ranks=ENGINES)
        box = [rv.to_json()]
    dist.broadcast_object_list(box, src=0)
    rv = Rendezvous.from_json(box[0])
    if is_trainer:
        sender.connect(rv)
    else:
        config = load_config("llama")
        layout = EngineLayout(config.id(), 2, 1, "packed", ENGINES, "llama", model_config(a))
        receiver = RefreshReceiver(
            rank=rank - TRAINERS, world=ENGINES, exchange_group=engines, layout=layout,
            config=config, device=torch.device("cpu"), public_key=a.pub,
            table={n: (("BF16" if t.dtype == torch.bfloat16 else "?"), tuple(t.shape))
                   for n, t in w.items()},
        )  # fmt: skip
        receiver.connect(rv)
        for t in w.values():
            t.zero_()  # the engine's buffers: what the broadcast writes into
    version = 0

    def broadcast() -> int:  # a plain gloo broadcast over the same four processes
        for t in w.values():
            dist.broadcast(t, src=0)
        return sum(t.numel() * t.element_size() for t in w.values()) * (TRAINERS + ENGINES - 1)

    held = w
    if is_trainer and a.device == "cuda":  # the trainer's weights on its GPU, as a trainer has them
        held = {n: t.to(f"cuda:{rank}") for n, t in w.items()}

    def refresh(check: RefreshCheck, *, nonfinite_check: bool = True) -> int:
        nonlocal version
        version += 1
        if is_trainer:
            sender.check = check
            return sender.send(held, version=version).bytes
        receiver.allow_nonfinite = not nonfinite_check
        receiver.start()
        receiver.receive(final=True)
        receiver.committed(version)  # the version moves on; nothing is copied into a model
        return 0

    arms = {
        "broadcast": broadcast,
        "refresh": lambda: refresh(RefreshCheck.FINGERPRINT),
        "refresh-sha256": lambda: refresh(RefreshCheck.SHA256),
        "refresh-no-nan-check": lambda: refresh(RefreshCheck.FINGERPRINT, nonfinite_check=False),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    wire: dict[str, int] = {}
    for r in range(a.rounds + 1):  # round 0 warms up (the kernels' load, the first allocations)
        for name, arm in arms.items():
            dist.barrier()
            t0 = time.perf_counter()
            sent = arm()
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            total = torch.tensor([sent], dtype=torch.int64)
            dist.all_reduce(total)
            if r:
                times[name].append(float(took))
                wire[name] = int(total) if name != "broadcast" else sent
    if rank == 0:
        Path(a.out).write_text(
            json.dumps({"times": times, "wire_bytes": wire, "args": vars(a)}, indent=1)
        )
    (sender if is_trainer else receiver).close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunk-mib", type=int, default=8)
    p.add_argument("--out", default="")
    p.add_argument(
        "--device", default="cpu", help="where the trainer ranks hold their weights (cpu or cuda)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--key", default="", help=argparse.SUPPRESS)
    p.add_argument("--pub", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    with tempfile.TemporaryDirectory() as tmp:
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric import ec

        k = ec.generate_private_key(ec.SECP256R1())
        key, pub = Path(tmp) / "k.pem", Path(tmp) / "k.pub.pem"
        key.write_bytes(
            k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
        )
        pub.write_bytes(
            k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
        )
        out = a.out or str(Path(tmp) / "bench.json")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(TRAINERS + ENGINES), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0",
            __file__, "--worker", "--key", str(key), "--pub", str(pub), "--out", out,
            *(f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
              if k in ("layers", "hidden", "inter", "vocab", "rounds", "chunk_mib", "device")),
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[1]))
        subprocess.run(cmd, check=True, env=env)
        doc = json.loads(Path(out).read_text())
    med = {k: statistics.median(v) for k, v in doc["times"].items()}
    size = sum(t.numel() * 2 for t in weights(a).values())
    print(
        f"weights: {size / 2**20:,.1f} MiB bf16 ({a.layers} layers, hidden {a.hidden}); 2 trainer "
        f"ranks -> 2 engine ranks (tp 2), gloo; median of {a.rounds} rounds"
    )
    for k, v in med.items():
        ratio = f"{v / med['broadcast']:.2f}x broadcast" if k != "broadcast" else "1.00x"
        print(f"  {k:<15} {v:8.3f} s  {ratio:<18} {doc['wire_bytes'][k] / 2**20:10,.1f} MiB sent")


if __name__ == "__main__":
    main()

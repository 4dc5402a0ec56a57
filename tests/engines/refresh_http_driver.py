"""vLLM's OpenAI server with the weight-transfer backend ``tpload``, driven over HTTP by vLLM's own
``HTTPVLLMWeightSyncClient`` from a 1-rank trainer (tpload's trainer engine posts ``/pause``
before a round and ``/resume`` after it). Run by the Python that has vLLM:

    python tests/engines/refresh_http_driver.py --model DIR --tp 2 --port P --work W --out R

Rounds: v1 good, v2 with a byte flipped in transit, v2 good. With ``--refresh-key`` (the server
and the trainer hold it), then: an init call from a process without the key (refused, the live
group untouched: the next round needs no new group), an oversized frame from a member after a
good round (the round refused, the engine alive), v3 good. After each: the greedy tokens
(``/v1/completions``), ``/weight_info`` and ``/is_paused``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from refresh_driver import FLIPPED, SHORT, source, weights  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--signer-key", default="", help="sign every manifest (sha256 strength)")
    ap.add_argument("--public-key", default="", help="the server requires it (and sha256)")
    ap.add_argument("--refresh-key", default="", help="the refresh key (server and trainer)")
    args = ap.parse_args()
    import requests

    base = f"http://127.0.0.1:{args.port}"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--tensor-parallel-size",
        str(args.tp),
        "--enforce-eager",
        "--max-model-len",
        "128",
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--block-size",
        "32",
        "--port",
        str(args.port),
        "--weight-transfer-config",
        '{"backend": "tpload"}',
    ]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    if args.public_key:  # the engine's own settings: the strong check, a signature required
        env.update(TPLOAD_REFRESH_CHECK="sha256", TPLOAD_REFRESH_PUBLIC_KEY=args.public_key)
    if args.refresh_key:  # the key's path, never the key
        env["TPLOAD_REFRESH_KEY"] = args.refresh_key
    log = open(work / "server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    result: dict = {"rounds": []}
    try:
        for _ in range(600):
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            time.sleep(1)

        def gen() -> list[int]:
            r = requests.post(
                f"{base}/v1/completions",
                json={
                    "model": args.model,
                    "prompt": SHORT,
                    "max_tokens": 8,
                    "temperature": 0,
                    "return_token_ids": True,
                },
                timeout=120,
            )
            r.raise_for_status()
            return list(r.json()["choices"][0]["token_ids"])

        def state() -> dict:
            return {
                "tokens": gen(),
                "weight_info": requests.get(f"{base}/weight_info", timeout=10).json(),
                "is_paused": requests.get(f"{base}/is_paused", timeout=10).json(),
            }

        import refresh_faults
        from vllm.distributed.weight_transfer import (
            HTTPVLLMWeightSyncClient,
            WeightTransferTrainerFactory,
        )

        from tpload.integrations.vllm_trainer import TploadTrainerInitInfo

        result["v0"] = state()
        client = HTTPVLLMWeightSyncClient(base)
        strong = {"check": "sha256", "signer_key": args.signer_key} if args.signer_key else {}
        keyed = {"key": args.refresh_key} if args.refresh_key else {}

        def connect(**kw: object):  # a trainer (a new transfer group: the engine ends the last)
            return WeightTransferTrainerFactory.trainer_init(
                TploadTrainerInitInfo(rank=0, **keyed, **kw), client=client
            )

        trainer = connect(**strong)
        model = Path(args.model)
        rounds = [(1, "good"), (2, "flipped byte")]
        rounds += [(2, "unsigned")] if args.signer_key else []
        rounds += [(2, "good")]
        if args.refresh_key:
            rounds += [(3, "unproven init"), (3, "oversized frame"), (3, "good")]
        for version, kind in rounds:
            if kind == "unsigned":  # a trainer with the default check and no key
                trainer.shutdown()
                trainer = connect()
            elif strong and trainer.sender.signer_key is None:
                trainer.shutdown()
                trainer = connect(**strong)
            refresh_faults.plant(kind, 0, flipped=FLIPPED)
            trainer.source = source(weights(model, version), 0, ranks=1)
            try:
                if kind == "unproven init":  # a process without the key calls the init endpoint
                    from tpload.refresh.rendezvous import open_rendezvous

                    rv, hub = open_rendezvous(trainer_ranks=1, engine_ranks=args.tp, timeout_s=5)
                    hub.close()
                    try:
                        client.init_weight_transfer_engine(rv.to_dict())
                    except Exception as e:  # noqa: BLE001 - the server's own line, from its body
                        from tpload.integrations.vllm_trainer import _engine_line

                        raise RuntimeError(_engine_line(e)) from None
                    raise RuntimeError("the unproven init was taken")
                if kind == "oversized frame":  # a member's frame far over what a manifest needs
                    group = trainer.sender.group
                    group.links[1].post(refresh_faults.CONTROL, memoryview(bytes(64 << 20)), 0)
                trainer.send_weights(version=version)
                error = ""
            except Exception as e:  # noqa: BLE001
                error = str(e)
            finally:
                refresh_faults.plant("good", 0, flipped=FLIPPED)
            result["rounds"].append({"version": version, "kind": kind, "error": error, **state()})
            print("round", result["rounds"][-1], flush=True)
        trainer.shutdown()
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

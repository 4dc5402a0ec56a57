"""Command line: ``torchrun --nproc-per-node N -m tpload [flags]`` and the subcommands.

    python -m tpload [--checkpoint DIR] [--kind packed|expanded] [--tp T] ...   load (the main job)
    python -m tpload synth DIR [--preset small|medium|seed] [--hidden H ...]     write a synthetic checkpoint
    python -m tpload bench [--preset medium] [--nproc 2 --tp 2 --rounds 3 --cold --json FILE]   tpload beside its peers
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable

from .api import LoadOptions, load_in, resolve_checkpoint
from .bench import cmd_bench
from .config import DEFAULT_CONFIG, shipped_configs
from .dist import init_distributed
from .errors import LoadError
from .plan import KINDS
from .synth import PRESETS, spec_from, write_checkpoint
from .verify import VERIFY_MODES


def _load_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tpload", description="Load every rank's verified shards of a native "
                                "checkpoint (run under torchrun). Subcommands: " + ", ".join(COMMANDS) + ".")
    p.add_argument("--checkpoint", help="checkpoint directory (default: a built-in small synthetic one, made once)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"shipped config ({', '.join(shipped_configs())}) or a TOML path")
    p.add_argument("--kind", choices=KINDS, default="packed", help="packed: stored bytes; expanded: bf16 decodes")
    p.add_argument("--tp", type=int, help="tensor-parallel degree (default: world size / ep)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (tp x ep = world size)")
    p.add_argument("--verify", choices=VERIFY_MODES, default="node", help="who hashes each tensor (default: node)")
    p.add_argument("--device", help="target device (default: cuda:LOCAL_RANK, else cpu)")
    p.add_argument("--report", help="write the rank-0 JSON report here")
    p.add_argument("--hash-threads", type=int, default=2, help="sha256 threads per rank")
    p.add_argument("--samples", type=int, default=4, help="expanded: exact host-decode checks per role")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout in seconds")
    p.add_argument("--no-progress", action="store_true", help="no rank-0 progress")
    p.add_argument("--log-level", default="INFO")
    return p


def _on_sigterm(signum: int, frame: object) -> None:
    # torchrun stops every worker with SIGTERM once one of them failed: say so
    # instead of dying silently, and let the normal error path exit non-zero.
    raise LoadError(f"rank {os.environ.get('RANK', '0')}: stopped by signal {signal.Signals(signum).name} "
                    "(torchrun stops every rank once one fails; see that rank's message)")


def cmd_load(argv: list[str]) -> int:
    args = _load_parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s tpload %(levelname)s %(message)s",
                        stream=sys.stderr)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        opts = LoadOptions(resolve_checkpoint(args.checkpoint), args.config, args.kind, args.tp, args.ep, args.verify,
                           args.device, args.hash_threads, args.samples, not args.no_progress, args.timeout)
        with init_distributed(device=opts.device, timeout_s=opts.timeout_s) as ctx:
            shards = load_in(opts, ctx)
            if ctx.rank == 0:
                print(shards.report.table(), flush=True)
                if args.report:
                    shards.report.write(args.report)
            shards.release()
    except LoadError as e:
        print(f"[rank {rank}] tpload: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def cmd_synth(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload synth", description="Write a synthetic native checkpoint "
                                "(shards, index, NATIVE_MANIFEST.json) exactly as format.md specifies.")
    p.add_argument("dir")
    p.add_argument("--preset", choices=list(PRESETS), default="small")
    for f in ("hidden", "inter", "experts", "stages", "vocab", "block", "shards", "seed"):
        p.add_argument(f"--{f}", type=int)
    args = p.parse_args(argv)
    try:
        spec = spec_from(args.preset, **{f: getattr(args, f) for f in
                                         ("hidden", "inter", "experts", "stages", "vocab", "block", "shards", "seed")})
    except ValueError as e:
        p.error(str(e))
    root = write_checkpoint(args.dir, spec)
    size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    print(f"wrote {root}: {size / 1e9:.3f} GB ({spec})")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"synth": cmd_synth, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return cmd_load(argv)


if __name__ == "__main__":
    sys.exit(main())

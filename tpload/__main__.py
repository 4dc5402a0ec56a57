"""Command line: ``torchrun --nproc-per-node N -m tpload [flags]`` and the subcommands.

    python -m tpload [--checkpoint DIR] [--kind packed|expanded] [--tp T] ...   load (the main job)
    python -m tpload synth DIR [--preset small|medium|seed] [--hidden H ...]     write a synthetic checkpoint
    python -m tpload plan DIR --tp T [--ep E] [--kind K] [--digest [--write]]    per-rank plan, predicted digests
    python -m tpload verify DIR [--config C]                                     check a checkpoint at rest
    python -m tpload manifest DIR [--force]                                      write NATIVE_MANIFEST.json
    python -m tpload bench [--preset medium] [--nproc 2 --tp 2 --rounds 3 --cold --json FILE]   tpload beside its peers
    python -m tpload export DIR OUT --tp T [--ep E] [--config C]                 write a pre-partitioned checkpoint
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from .api import LoadOptions, load_in, resolve_checkpoint
from .bench import cmd_bench
from .checkpoint import Checkpoint
from .config import DEFAULT_CONFIG, load_config, shipped_configs, with_rules
from .dist import init_distributed
from .errors import LoadError
from .export import export, rank_file
from .offline import PREDICTIONS_NAME, plan_rows, predict, record_verified, verify_checkpoint
from .plan import KINDS, Layout, Planner
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
    p.add_argument("--skip", action="append", default=[], metavar="GLOB",
                   help="never read nor hash tensors matching GLOB (repeatable), e.g. 'mtp.*' or '*.input_scale'")
    p.add_argument("--defer", action="append", default=[], metavar="GLOB",
                   help="do not upload tensors matching GLOB; load() returns their locators (repeatable)")
    p.add_argument("--evict-page-cache", action="store_true",
                   help="drop each shard's page cache once this rank is done with it (unified-memory GPUs)")
    p.add_argument("--reserve-gib", type=float, default=0.0,
                   help="device memory (GiB) the pre-flight check keeps free for after the load (default 0)")
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
                           args.device, args.hash_threads, args.samples, not args.no_progress, args.timeout,
                           skip=tuple(args.skip), defer=tuple(args.defer), evict_page_cache=args.evict_page_cache,
                           reserve_gib=args.reserve_gib)
        with init_distributed(device=opts.device, timeout_s=opts.timeout_s) as ctx:
            shards = load_in(opts, ctx)
            if ctx.rank == 0:
                print(shards.report.table(), flush=True)
                if args.report:
                    shards.report.write(args.report)
            shards.release()
    except LoadError as e:
        # torchrun SIGTERMs the others as soon as one rank exits: finish this message first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


def _fail(e: LoadError) -> int:
    print(f"tpload: error: {e}", file=sys.stderr, flush=True)
    return 1


def cmd_plan(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload plan", description="Print every rank's plan without a GPU; "
                                "with --digest the digests a load must produce (computed on the CPU by the load's code).")
    p.add_argument("dir")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--kind", choices=KINDS, default="packed")
    p.add_argument("--digest", action="store_true", help="compute each rank's digest on the CPU")
    p.add_argument("--write", action="store_true", help=f"check every tensor by sha256, then store the digests in "
                   f"DIR/{PREDICTIONS_NAME} (implies --digest)")
    args = p.parse_args(argv)
    try:
        config = load_config(args.config)
        planner = Planner(Checkpoint(args.dir), config)
        layout = Layout(args.tp, args.ep)
        planner.check_layout(layout, layout.world)
        plans = plan_rows(planner, layout, args.kind)
        if args.write:
            digests, path = record_verified(planner, layout, args.kind)
        else:
            digests = predict(planner, layout, args.kind) if args.digest else ["-"] * len(plans)
    except LoadError as e:
        return _fail(e)
    print(f"plan for {args.dir} (config {config.name}, tp {args.tp} x ep {args.ep}, kind {args.kind})")
    print(f"{'rank':>4} {'tensors':>8} {'read GB':>8} {'device GB':>9} {'transient MiB':>13}  digest")
    for plan, dig in zip(plans, digests):
        served = sum(len(i.outputs) for i in plan.items)
        print(f"{plan.rank:>4} {served:>8} {plan.read_bytes / 1e9:>8.3f} {plan.arena_bytes / 1e9:>9.3f} "
              f"{plan.largest_transient / 2**20:>13.1f}  {dig}")
    if args.write:
        print(f"wrote {path}: every tensor checked by sha256 first; loads with this layout, kind and config will be "
              "checked against these digests, and --verify digest loads may trust them in place of hashing")
    return 0


def cmd_verify(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload verify", description="Check a checkpoint at rest: headers, "
                                "manifest, every sha256, scale bytes and NaN codes; list every bad tensor.")
    p.add_argument("dir")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="roles for the value checks ('none' to skip them)")
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args(argv)
    try:
        config = None if args.config == "none" else load_config(args.config)
    except LoadError as e:
        return _fail(e)
    problems = verify_checkpoint(Path(args.dir), config, threads=args.threads)
    for line in problems:
        print(f"BAD {line}")
    print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def cmd_manifest(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload manifest", description="Hash every tensor and write "
                                "NATIVE_MANIFEST.json for a checkpoint that lacks one.")
    p.add_argument("dir")
    p.add_argument("--force", action="store_true", help="overwrite an existing manifest")
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args(argv)
    try:
        path = Checkpoint(args.dir).write_manifest(force=args.force, threads=args.threads)
    except LoadError as e:
        return _fail(e)
    print(f"wrote {path}")
    return 0


def cmd_export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tpload export", description="Write a pre-partitioned checkpoint: "
                                "one packed safetensors file per rank of a tp x ep layout, with its own manifest. "
                                "Loading it with the same layout reads only each rank's own file.")
    p.add_argument("dir", help="the native checkpoint to cut")
    p.add_argument("out", help="a new (or empty) folder for the rank files")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (world = tp x ep)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"shipped config ({', '.join(shipped_configs())}) or a TOML path")
    p.add_argument("--skip", action="append", default=[], metavar="GLOB", help="leave these tensors out (repeatable)")
    p.add_argument("--defer", action="append", default=[], metavar="GLOB",
                   help="copy these whole into each holding rank's file, to be located, not loaded (repeatable)")
    p.add_argument("--hash-threads", type=int, default=2, help="sha256 threads checking the source")
    args = p.parse_args(argv)
    try:
        config = with_rules(load_config(args.config), skip=tuple(args.skip), defer=tuple(args.defer))
        done = export(args.dir, args.out, Layout(args.tp, args.ep), config, hash_threads=args.hash_threads)
    except LoadError as e:
        return _fail(e)
    for rank, n in enumerate(done.rank_bytes):
        print(f"rank {rank}: {rank_file(rank, done.layout.world)} {n / 1e9:.3f} GB")
    print(f"wrote {done.out}: tp {done.layout.tp} x ep {done.layout.ep}, {sum(done.rank_bytes) / 1e9:.3f} GB")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"synth": cmd_synth, "plan": cmd_plan, "verify": cmd_verify,
                                                   "manifest": cmd_manifest, "bench": cmd_bench, "export": cmd_export}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return cmd_load(argv)


if __name__ == "__main__":
    sys.exit(main())

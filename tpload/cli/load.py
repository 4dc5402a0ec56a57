"""The load's command: ``torchrun --nproc-per-node N -m tpload [DIR] [flags]``, one rank each."""

from __future__ import annotations

import gc
import logging
import os
import shlex
import signal
from types import FrameType

from ..model.errors import LoadError
from ..model.text import escape_name, plural
from ..options.flags import closest, from_args
from ..options.load_options import LoadOptions
from ..storage.files import STDOUT
from .output import configure_logging, fail_rank, first_on_node, one_line, refuse_launch, say
from .parsers import SUBCOMMANDS, load_parser


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    # torchrun stops every worker with SIGTERM once one of them failed (or when it is stopped
    # itself): say so, and let the normal error path reach the exchange and exit non-zero.
    raise LoadError(
        f"stopped by signal {signal.Signals(signum).name} (the launcher stops every rank once one "
        "rank fails, or when it is stopped itself)"
    )


def collector_policy() -> None:
    """The command owns its process, so it may set what the library may not: what the imports
    made (torch's, numpy's, numba's: hundreds of thousands of objects that live as long as the
    process) is frozen out of the collector's walks, and a full collection waits for more young
    ones, so the load's own collections walk little (docs/benchmarks.md has the figures)."""
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)  # a young collection every 50,000 objects, not 700


def first_run_notes(opts_checkpoint: str | None) -> None:
    """Rank 0 says what the first run spends its first seconds on, before it spends them."""
    if os.environ.get("RANK", "0") != "0":
        return
    from ..kernels.ahead import find
    from .kernel_cache import compiled, kernel_cache

    log = logging.getLogger("tpload")
    cache = kernel_cache()  # where numba will look for them, and write them
    if not compiled(cache) and find([cache]) is None:  # compiled ahead: numba compiles nothing
        log.info(
            "compiling tpload's CPU kernels once (about 10 s; cached in %s; `python -m tpload "
            "kernels` compiles them ahead, for a faster first call)",
            cache,
        )
    if opts_checkpoint is None:
        from ..tools.synth import PRESETS, cache_root

        log.info(
            "using the built-in synthetic checkpoint (%s) under %s; writing it if it is not there "
            "yet",
            PRESETS["small"],
            cache_root(),
        )


def first_line(opts: LoadOptions) -> None:
    """Rank 0 says what it loads before torch's import (seconds, before anything else shows);
    part of its progress (``--no-progress``: not said)."""
    if os.environ.get("RANK", "0") != "0" or not opts.progress:
        return
    from .. import __version__

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = opts.tp or max(1, world // opts.ep // opts.replicas)
    logging.getLogger("tpload").info(
        "tpload %s: loading %s at tp %d x ep %d on %s, kind %s, verify %s (torch's import first)",
        __version__,
        escape_name(os.fspath(opts.checkpoint)) if opts.checkpoint else "the built-in checkpoint",
        tp,
        opts.ep,
        plural(world, "rank"),
        opts.kind,
        opts.verify,
    )


def launch_problem(opts: LoadOptions, argv: list[str]) -> str | None:
    """What is wrong with how the load was started, found in a moment instead of at the rendezvous
    or the first read: several ranks asked of a process torchrun did not start, or a checkpoint
    path that is not there (on one node only: on several, a folder missing on one node would leave
    the others waiting at the rendezvous until --timeout, so there the load's own check says it,
    on every rank through the exchange)."""
    world, degrees = opts.ranks_asked()
    if world > 1 and "WORLD_SIZE" not in os.environ:  # no launcher set up a group
        asked = " ".join(f"--{name} {n}" for name, n in degrees)
        return (
            f"{asked} needs {plural(world, 'rank')}, one process each, but this process was not "
            f"launched by torchrun; run: torchrun --nproc-per-node {world} -m tpload "
            f"{shlex.join(argv)}"
        )
    one_node = os.environ.get("WORLD_SIZE", "1") == os.environ.get("LOCAL_WORLD_SIZE", "1")
    if one_node and opts.checkpoint is not None and not os.path.exists(opts.checkpoint):
        return missing(os.fspath(opts.checkpoint))
    return None


def missing(path: str) -> str:
    """A checkpoint path that is not there, and the subcommand it may be a typo of."""
    guess = closest(path, SUBCOMMANDS)
    return f"{escape_name(path)}: checkpoint directory does not exist" + (
        f"; did you mean {guess} (a subcommand)?" if guess else ""
    )


INTERRUPTED = 130
"""The exit code of a Ctrl-C (128 + SIGINT), at any phase (README's exit codes)."""


def interrupted(e: KeyboardInterrupt, rank: str) -> int:
    """A Ctrl-C's end on one rank: one line, from each node's first rank only (a terminal's Ctrl-C
    reaches every rank of the node; a rank interrupted alone is named by its peers' verdict)."""
    if first_on_node():
        where = f" {e.args[0]}" if e.args else ""
        say(f"[rank {rank}] tpload: interrupted (Ctrl-C){where}; nothing was loaded")
    return INTERRUPTED


@one_line
def cmd_load(argv: list[str]) -> int:
    rank = os.environ.get("RANK", "0")
    typo = argv[0] if argv and not argv[0].startswith("-") else None
    if typo and closest(typo, SUBCOMMANDS) and not os.path.exists(typo):  # `tpload verfy DIR`:
        return refuse_launch(missing(typo), rank)  # (before the parser: DIR would be one too many)
    args = load_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        configure_logging(args.log_level)
        given = getattr(args, "checkpoint", None)
        if args.dir and given and args.dir != given:
            raise LoadError(f"two checkpoints given: {args.dir} and --checkpoint {given}")
        opts = from_args(args, extra={"checkpoint": args.dir or given})
        problem = launch_problem(opts, argv)
        if problem is not None:
            return refuse_launch(problem, rank)
        first_line(opts)
        first_run_notes(opts.checkpoint)
        from dataclasses import replace

        from ..kernels.lazy import warm

        kernels = warm()  # beside the imports (and the built-in checkpoint's writing)
        from ..api import load_in
        from ..distributed.world import init_distributed
        from ..tools.synth import resolve_checkpoint

        opts = replace(opts, checkpoint=resolve_checkpoint(opts.checkpoint))
        if kernels is not None:
            kernels.join()  # before the rendezvous, so every rank's load starts together
        collector_policy()
        with init_distributed(timeout_s=opts.timeout_s) as ctx:
            shards = load_in(opts, ctx)
            if ctx.rank == 0:  # with --report -, the JSON is standard output's (written already)
                if opts.report == STDOUT:
                    say(shards.report.table())
                else:
                    print(shards.report.table(), flush=True)
            shards.release()
    except LoadError as e:
        # torchrun SIGTERMs the others as soon as one rank exits: finish this message first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return fail_rank(e, rank)
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # torchrun passes a terminal's Ctrl-C on
        return interrupted(e, rank)
    return 0

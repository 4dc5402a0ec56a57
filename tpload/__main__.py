"""Command line: ``torchrun --nproc-per-node N -m tpload [DIR] [flags]`` and the subcommands.

    python -m tpload [DIR] [--kind packed|expanded] [--tp T] ...
        load (the main job; flags: --help)
    python -m tpload synth DIR [--preset small|medium|seed] [--hidden H ...]
        write a synthetic checkpoint
    python -m tpload plan DIR --tp T [--ep E] [--kind K] [--digest [--write]]
        per-rank plan, predicted digests
    python -m tpload verify DIR [--config C]
        check a checkpoint at rest
    python -m tpload manifest DIR [--force] [--hash blake3]
        write NATIVE_MANIFEST.json (+ blake3)
    python -m tpload bench [--preset medium] [--nproc 2 --tp 2 --rounds 3]
        tpload beside its peers
    python -m tpload export DIR OUT --tp T [--ep E] [--config C]
        write a pre-partitioned checkpoint
    python -m tpload attest verify FILE --checkpoint DIR [--key PEM]
        check a load attestation (--attest)

The load's flags are generated from :class:`tpload.options.LoadOptions`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _refuse_a_shadowing_folder() -> None:
    """``python -m tpload`` puts the current folder first on the path: run from the folder that
    holds a clone, its ``tpload/`` (the clone, with no ``__init__.py``) becomes an empty namespace
    package that hides the installed one, and every import from it fails. Say so in one line."""
    package = sys.modules.get(__package__ or "tpload")
    if package is not None and getattr(package, "__file__", None) is None:
        where = (
            ", ".join(dict.fromkeys(map(os.path.abspath, getattr(package, "__path__", [])))) or "?"
        )
        sys.exit(
            f"tpload: error: the folder {where} hides the installed tpload: Python imports it "
            "(from the current folder) as an empty package, since it holds the source rather "
            "than being it (a clone?). Run from another folder, or from inside the clone to use "
            "its source"
        )


_refuse_a_shadowing_folder()  # before the imports below: they are what fails in a shadowed tpload

from . import __version__  # noqa: E402  after the shadowing check
from .errors import LoadError  # noqa: E402  after the shadowing check
from .options import (  # noqa: E402  after the shadowing check
    COUNT,
    KINDS,
    RANKS,
    SEED,
    THREADS,
    Parser,
    add_flags,
    check_flags,
    from_args,
)
from .text import printable  # noqa: E402  after the shadowing check


def _load_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload",
        description="Load every rank's verified shards of a "
        "checkpoint (run under torchrun). Subcommands: " + ", ".join(COMMANDS) + ".",
    )
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="checkpoint directory (or --checkpoint DIR)"
    )
    add_flags(p)
    p.add_argument(
        "--log-level",
        default="INFO",
        help="tpload's logging level (default INFO); other libraries' "
        "loggers stay at WARNING unless named: --log-level DEBUG,numba=DEBUG",
    )
    p.add_argument("--version", action="version", version=f"tpload {__version__}")
    return p


def _on_sigterm(signum: int, frame: object) -> None:
    # torchrun stops every worker with SIGTERM once one of them failed (or when it is stopped
    # itself): say so, and let the normal error path reach the exchange and exit non-zero.
    raise LoadError(
        f"stopped by signal {signal.Signals(signum).name} (the launcher stops every rank once one "
        "rank fails, or when it is stopped itself)"
    )


def _say(text: str) -> None:
    """``text`` and its newline on stderr in one write: ranks share torchrun's stderr, and a message
    written apart from its newline lets another rank's line run on after it."""
    sys.stderr.flush()
    data = (text + "\n").encode(sys.stderr.encoding or "utf-8", "backslashreplace")
    try:
        fd = sys.stderr.fileno()
    except (
        AttributeError,
        OSError,
        ValueError,
    ):  # a replaced stderr (pytest's capture): no fd of its own
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    while data:  # one write unless the pipe takes part (over PIPE_BUF, 4 KiB: not atomic anyway)
        data = data[os.write(fd, data) :]


def _fail(e: BaseException, rank: str | None = None) -> int:
    prefix = f"[rank {rank}] " if rank is not None else ""
    _say(f"{prefix}tpload: error: {printable(str(e))}")
    return 1


def _fail_rank(e: LoadError, rank: str) -> int:
    """A failed load's end on one rank. A verdict every rank holds is printed in full by its
    reporter (the lowest failing rank) and pointed to by the others, so N ranks show it once; under
    torchrun it also goes to the elastic error file, so torchrun's summary shows it as the root
    cause."""
    reporter = e.reporter
    if reporter is None or str(reporter) == rank:
        line, first = f"[rank {rank}] tpload: error: {printable(str(e))}", True
    else:
        line, first = f"[rank {rank}] tpload: load failed (see rank {reporter})", False
    _say(line)
    _error_file(line, root_cause=first or reporter is None)
    return 1


def _error_file(line: str, *, root_cause: bool) -> None:
    """Write torch.distributed.elastic's error file (``TORCHELASTIC_ERROR_FILE``, set by torchrun
    for each worker) with ``line``, in the JSON its ``record`` decorator writes. torchrun names the
    failure with the earliest timestamp (whole seconds; ties: the first it saw exit) as the root
    cause, so a rank that only points to the reporter dates its own a second past the next whole
    second: the reporter's (written within moments of it) is then the earliest, whichever rank exits
    first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json
    import math

    now = time.time()
    stamp = int(now) if root_cause else math.ceil(now) + 1
    doc = {
        "message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(stamp)}}
    }
    try:
        Path(path).write_text(json.dumps(doc))
    except OSError as e:  # the message is on stderr already: the summary only loses it
        _say(f"tpload: could not write torchrun's error file {printable(path)}: {e.strerror}")


def _configure_logging(spec: str) -> None:
    """``LEVEL[,NAME=LEVEL...]``: tpload's loggers at LEVEL, each named logger at its own; every
    other library's stays at WARNING (numba's compiler alone logs ~77,000 DEBUG lines), and each
    line names the logger it came from, so nothing foreign reads as tpload's."""
    levels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, level = part.rpartition("=")
        if not isinstance(logging.getLevelName(level.upper()), int):
            raise LoadError(
                f"--log-level {spec}: {level!r} is not a level (DEBUG, INFO, WARNING, ERROR, "
                "CRITICAL)"
            )
        levels[name or "tpload"] = level.upper()
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _one_line(cmd: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """A subcommand that ends in one line whatever fails: its own errors (LoadError), the system's
    (a full disk, a file in the way: named by path) and, for a bug, its type and message (the
    traceback with TPLOAD_TRACEBACK=1)."""

    @functools.wraps(cmd)
    def run(argv: list[str]) -> int:
        rank = os.environ.get("RANK")
        try:
            return cmd(argv)
        except LoadError as e:
            return _fail(e, rank)
        except OSError as e:
            where = f"{e.filename}: " if e.filename is not None else ""
            to = f" -> {e.filename2}" if e.filename2 is not None else ""
            return _fail(LoadError(f"{where}{e.strerror or e}{to}"), rank)
        except Exception as e:
            if os.environ.get("TPLOAD_TRACEBACK"):
                raise
            return _fail(
                LoadError(
                    f"unexpected {type(e).__name__}: {e} (a bug in tpload; TPLOAD_TRACEBACK=1 "
                    "shows where)"
                ),
                rank,
            )

    return run


def _first_run_notes(opts_checkpoint: str | None) -> None:
    """Rank 0 says what the first run spends its first seconds on, before it spends them."""
    if os.environ.get("RANK", "0") != "0":
        return
    log = logging.getLogger("tpload")
    cache = Path(__file__).parent / "__pycache__"
    if not any(cache.glob("kernels.*.nbi")):
        log.info("compiling tpload's CPU kernels once (about 10 s; cached in %s)", cache)
    if opts_checkpoint is None:
        from .tools.synth import PRESETS, cache_root

        log.info(
            "using the built-in synthetic checkpoint (%s) under %s; writing it if it is not there "
            "yet",
            PRESETS["small"],
            cache_root(),
        )


@_one_line
def cmd_load(argv: list[str]) -> int:
    args = _load_parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _configure_logging(args.log_level)
        given = getattr(args, "checkpoint", None)
        if args.dir and given and args.dir != given:
            raise LoadError(f"two checkpoints given: {args.dir} and --checkpoint {given}")
        opts = from_args(args, extra={"checkpoint": args.dir or given})
        _first_run_notes(opts.checkpoint)
        from dataclasses import replace

        from .codecs._lazy import warm

        kernels = warm()  # beside the imports (and the built-in checkpoint's writing)
        from .api import load_in
        from .distributed import init_distributed
        from .tools.synth import resolve_checkpoint

        opts = replace(opts, checkpoint=resolve_checkpoint(opts.checkpoint))
        if kernels is not None:
            kernels.join()  # before the rendezvous, so every rank's load starts together
        with init_distributed(timeout_s=opts.timeout_s) as ctx:
            shards = load_in(opts, ctx)
            if ctx.rank == 0:
                print(shards.report.table(), flush=True)
            shards.release()
    except LoadError as e:
        # torchrun SIGTERMs the others as soon as one rank exits: finish this message first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return _fail_rank(e, rank)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _say(f"[rank {rank}] tpload: interrupted")
        return 130
    return 0


@_one_line
def cmd_synth(argv: list[str]) -> int:
    from .tools.published import PUBLISHED
    from .tools.synth import PRESETS, spec_from, write_checkpoint

    p = Parser(
        prog="python -m tpload synth",
        description="Write a synthetic checkpoint: the "
        "reference native layout of docs/format.md (small, medium, seed), or a published "
        "family's layout (NAME-tiny, NAME-full --headers-only, deepseek-v3-deep; "
        "docs/formats/), with shards, index, config.json and NATIVE_MANIFEST.json.",
    )
    p.add_argument("dir", help="a new or empty folder")
    from .tools.synth_gguf import GGUF_PRESETS, HEADERS_ONLY, write_gguf_preset, write_headers_only

    p.add_argument(
        "--preset",
        choices=list(PRESETS) + list(PUBLISHED) + list(GGUF_PRESETS) + list(HEADERS_ONLY),
        default="small",
    )
    p.add_argument(
        "--headers-only",
        action="store_true",
        help="(NAME-full presets) real headers and index, holes "
        "for data: sparse files that use no disk; only `plan` reads them",
    )
    p.add_argument(
        "--hub",
        metavar="ORG/NAME",
        help="(published presets) lay the files out as a hub cache under DIR (blobs named by "
        "hash, snapshots/REV linking to them), without a manifest; load the printed folder",
    )
    dims = ("hidden", "inter", "experts", "stages", "vocab", "block", "shards", "seed")
    for f in dims:
        p.add_argument(f"--{f}", type=SEED if f == "seed" else COUNT)
    p.add_argument(
        "--tensors",
        type=COUNT,
        metavar="N",
        help="(many-tensors) how many tiny 8x8 tensors (default 10000)",
    )
    args = p.parse_args(argv)
    if args.preset in HEADERS_ONLY and not args.headers_only:
        p.error(f"{args.preset} is written only --headers-only")
    if (
        args.preset in GGUF_PRESETS or args.preset in HEADERS_ONLY
    ):  # GGUF split sets (docs/formats/gguf.md)
        root = (
            write_headers_only(args.dir, args.preset)
            if args.preset in HEADERS_ONLY
            else write_gguf_preset(args.dir, args.preset, seed=args.seed or 0)
        )
        print(
            f"wrote {printable(str(root))}: {len(list(root.glob('*.gguf')))} GGUF files, preset "
            f"{args.preset}"
        )
        return 0
    if args.preset in PUBLISHED:
        return _synth_published(p, args, dims)
    if args.headers_only or args.hub or args.tensors:
        p.error(
            "--headers-only, --hub and --tensors are for the published presets (NAME-tiny, "
            "NAME-full, deepseek-v3-deep, many-tensors)"
        )
    try:
        spec = spec_from(args.preset, **{f: getattr(args, f) for f in dims})
    except ValueError as e:
        p.error(str(e))
    root = write_checkpoint(args.dir, spec)
    size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    print(f"wrote {root}: {size / 1e9:.3f} GB ({spec})")
    return 0


def _synth_published(
    p: argparse.ArgumentParser, args: argparse.Namespace, dims: tuple[str, ...]
) -> int:
    from .tools.published import PUBLISHED, write_published
    from .tools.synth import write_hub

    if any(getattr(args, f) is not None for f in dims if f != "seed"):
        p.error("the published presets take no dimension flags (their dimensions are the family's)")
    full = PUBLISHED[args.preset]().headers_only
    if full != args.headers_only:
        p.error(f"{args.preset} {'is written only' if full else 'is not written'} --headers-only")
    if args.hub and full:
        p.error("--hub is for presets with data")
    if args.hub:
        root = write_hub(
            args.dir,
            args.hub,
            lambda out: write_published(out, args.preset, seed=args.seed or 0, manifest=False),
        )
    else:
        root = write_published(args.dir, args.preset, seed=args.seed or 0, tensors=args.tensors)
    shards = list(root.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in shards)
    used = sum(f.stat().st_blocks * 512 for f in shards)
    print(
        f"wrote {printable(str(root))}: {len(shards)} shards, {size / 1e9:.3f} GB "
        f"({used / 1e9:.3f} GB on disk), preset {args.preset}"
    )
    return 0


def _config(args: argparse.Namespace, root: str):
    """The config ``--config`` names for the checkpoint at ``root`` (auto: found from its files,
    saying why)."""
    from pathlib import Path

    from .config import with_rules
    from .pick import choose

    config, why = choose(getattr(args, "config", None) or "auto", Path(root).absolute())
    if why:
        print(printable(why))
    return with_rules(
        config,
        skip=tuple(getattr(args, "skip", ()) or ()),
        defer=tuple(getattr(args, "defer", ()) or ()),
        skip_activation_scales=getattr(args, "skip_activation_scales", False),
    )


@_one_line
def cmd_plan(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload plan",
        description="Print every rank's plan without a GPU "
        "(reads, hashing, device and host memory; each node's share); with --digest the digests "
        "a load must produce (computed on the CPU by the load's code).",
    )
    p.add_argument("dir")
    p.add_argument("--tp", type=RANKS, required=True)
    p.add_argument("--ep", type=RANKS, default=1)
    p.add_argument("--kind", choices=KINDS, default="packed")
    p.add_argument(
        "--nproc-per-node",
        type=RANKS,
        default=None,
        metavar="N",
        help="ranks per node (default: all on one node): node verification splits hashing per node",
    )
    p.add_argument(
        "--ranks",
        choices=("all", "summary"),
        default=None,
        help="print every rank, or one line per node (default: every rank up to 16 ranks)",
    )
    p.add_argument(
        "--replicas",
        type=RANKS,
        default=1,
        metavar="R",
        help="also print, for R replicas sharing the reads, storage and interconnect bytes per "
        "node",
    )
    add_flags(p, only=("config", "skip", "defer", "skip_activation_scales", "digest_store"))
    p.add_argument("--digest", action="store_true", help="compute each rank's digest on the CPU")
    p.add_argument(
        "--write",
        action="store_true",
        help="check every tensor by sha256, then keep the digests in the "
        "digest store (implies --digest); --verify digest loads may then trust them",
    )
    args = p.parse_args(argv)
    check_flags(args)
    t0 = time.monotonic()
    try:
        from .plan import Layout
        from .tools.sizing import HostMemory, costs, planning, render_costs

        imported = time.monotonic() - t0
        config = _config(args, args.dir)
        layout = Layout(args.tp, args.ep)
        per_node = args.nproc_per_node or layout.world
        t1, host = time.monotonic(), HostMemory()
        with planning(args.dir, config, layout) as planner:
            host.classified()
            plans = [planner.plan(layout, args.kind, r) for r in range(layout.world)]
            ranks, nodes = costs(plans, planner.catalogue, per_node)
            host.planned(len(plans))
            catalogue, notes = planner.catalogue, planner.notes()
        seconds = time.monotonic() - t1
        path = None
        if (
            args.write or args.digest
        ):  # the load's own code (numba's kernels): imported only to run it
            from .tools.offline import predict, record_verified
        if args.write:
            digests, path = record_verified(
                args.dir, config, layout, args.kind, store=getattr(args, "digest_store", None)
            )
        else:
            digests = (
                predict(args.dir, config, layout, args.kind) if args.digest else ["-"] * len(plans)
            )
    except LoadError as e:
        return _fail(e)
    print(
        f"plan for {printable(args.dir)} (config {printable(config.name)}, tp {args.tp} x ep "
        f"{args.ep}, kind {args.kind}, {len(nodes)} node(s) of {per_node} rank(s))"
    )
    if config.description:
        print(f"config {printable(config.name)}: {printable(config.description)}")
    for line in notes:  # the weight prefix, the KV-cache scale census, the activation scales
        print(printable(line))
    print(
        render_costs(
            ranks,
            nodes,
            digests,
            host,
            every_rank=(args.ranks or ("all" if len(plans) <= 16 else "summary")) == "all",
            headers_only=catalogue.headers_only,
        )
    )
    if args.replicas > 1:
        from .replica_split import plan_lines

        print("\n".join(plan_lines(plans, args.replicas, per_node)))
    print(
        f"planned {len(plans)} rank(s) of {len(catalogue.tensors):,} tensors in {seconds:.2f} s "
        f"(headers, classification, plans, figures; imports {imported:.2f} s before); peak RSS "
        f"{host.peak / 2**20:,.0f} MiB"
    )
    if path is not None:
        print(
            f"wrote {path}: every tensor checked by sha256 first; loads with this layout, kind "
            "and config are checked against these digests, and --verify digest loads may trust "
            "them in place of hashing"
        )
    return 0


@_one_line
def cmd_verify(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload verify",
        description="Check a checkpoint at rest: headers, "
        "index, manifest, every sha256, scale bytes, NaN codes and overflowing decodes; list "
        "every bad tensor. An export is checked rank file by rank file.",
    )
    p.add_argument("dir")
    p.add_argument(
        "--config",
        default="auto",
        help="roles for the value checks (auto: from DIR's config.json; 'none' to skip them)",
    )
    p.add_argument(
        "--threads", type=THREADS, default=2, help="hash worker threads (0: on the main thread)"
    )
    args = p.parse_args(argv)
    try:
        from .tools.offline import verify_checkpoint

        config = None if args.config == "none" else _config(args, args.dir)
        problems = verify_checkpoint(args.dir, config, threads=args.threads)
    except LoadError as e:
        return _fail(e)
    for line in problems:
        print(f"BAD {printable(line)}")
    if not problems:
        print(printable(_verified(args.dir, config)))
    print(f"{printable(args.dir)}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def _verified(root: str, config: object | None) -> str:
    """What a passing ``verify`` checked and what vouched for it, counted from the headers (no data
    read again; the checkpoint just passed, so it opens)."""
    import json

    from .storage.catalogue import MANIFEST_NAME
    from .storage.partitioned import PartitionedStorage, is_partitioned
    from .storage.sharded import ShardedStorage

    path = Path(root).absolute()
    if is_partitioned(path):
        meta = json.loads((path / MANIFEST_NAME).read_text())["partitioned"]
        tp, ep = int(meta["tp"]), int(meta["ep"])
        count = nbytes = 0
        for rank in range(tp * ep):
            storage = PartitionedStorage(path, tp=tp, ep=ep, rank=rank, world=tp * ep)
            try:
                count += len(storage.windows)
                nbytes += sum(storage.stored(n).nbytes for n in storage.windows)
            finally:
                storage.close()
        return (
            f"checked {count:,} windows in {tp * ep} rank file(s), {nbytes / 1e9:.3f} GB: each "
            f"window's sha256 against the export's {MANIFEST_NAME}"
        )
    storage = ShardedStorage(path)
    try:
        cat = storage.catalogue
        names = cat.names()
        nbytes = sum(cat.get(n).nbytes for n in names)
        if storage.file_digests is not None:
            vouch = (
                f"each of its {len(storage.file_digests)} files whole, by sha256 against "
                f"{storage.file_source.each}"
            )
        else:
            vouch = (
                f"each tensor by sha256 against {MANIFEST_NAME} (sha256 "
                f"{(cat.manifest_sha256 or '?')[:16]}...)"
            )
    finally:
        storage.close()
    values = (
        f"; values (scales, NaN codes, bf16 overflow) by config {getattr(config, 'name', config)}"
        if config is not None
        else "; no value checks (--config none)"
    )
    return f"checked {len(names):,} tensors, {nbytes / 1e9:.3f} GB: {vouch}{values}"


@_one_line
def cmd_manifest(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload manifest",
        description="Hash every tensor and write "
        "NATIVE_MANIFEST.json for a checkpoint that lacks one; with --hash blake3, also keep "
        "a blake3 of every tensor in the digest store, after checking each one's sha256 "
        "against the manifest (loads then hash with blake3).",
    )
    p.add_argument("dir")
    p.add_argument("--force", action="store_true", help="overwrite an existing manifest")
    p.add_argument(
        "--threads", type=THREADS, default=2, help="hash worker threads (0: on the main thread)"
    )
    p.add_argument(
        "--hash",
        choices=("sha256", "blake3"),
        default="sha256",
        help="blake3: also write blake3 digests to the digest store (writes the manifest first if "
        "there is none; the manifest's bytes are not changed); needs the blake3 package (`pip "
        "install blake3`)",
    )
    add_flags(p, only=("digest_store",))
    args = p.parse_args(argv)
    check_flags(args)
    try:
        from .storage.catalogue import MANIFEST_NAME
        from .tools.offline import write_blake3, write_manifest

        blake3 = args.hash == "blake3"
        if blake3:
            from .verification.blake3sums import require

            require()  # before hours of hashing
        if (
            not blake3
            or args.force
            or not os.path.lexists(Path(args.dir).absolute() / MANIFEST_NAME)
        ):
            written = write_manifest(args.dir, force=args.force, threads=args.threads)
            print(f"wrote {printable(str(written))}")
        if blake3:
            side = write_blake3(
                args.dir, threads=args.threads, store=getattr(args, "digest_store", None)
            )
            print(
                f"wrote {printable(str(side))}: every tensor's sha256 matched the manifest; loads "
                "(--verify node or rank) now check bytes by blake3 against it"
            )
    except LoadError as e:
        return _fail(e)
    return 0


@_one_line
def cmd_export(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload export",
        description="Write a pre-partitioned checkpoint: "
        "one packed safetensors file per rank of a tp x ep layout, with its own manifest. "
        "Loading it with the same layout reads only each rank's own file.",
    )
    p.add_argument("dir", help="the native checkpoint to cut")
    p.add_argument("out", help="a new (or empty) folder for the rank files")
    p.add_argument("--tp", type=RANKS, required=True, help="tensor-parallel degree")
    p.add_argument("--ep", type=RANKS, default=1, help="expert-parallel degree (world = tp x ep)")
    add_flags(p, only=("config", "skip", "defer", "hash_threads"))
    args = p.parse_args(argv)
    try:
        from .plan import Layout
        from .storage.partitioned import rank_file
        from .tools.export import export

        done = export(
            args.dir,
            args.out,
            Layout(args.tp, args.ep),
            _config(args, args.dir),
            hash_threads=getattr(args, "hash_threads", 2),
        )
    except LoadError as e:
        return _fail(e)
    for rank, n in enumerate(done.rank_bytes):
        print(f"rank {rank}: {rank_file(rank, done.layout.world)} {n / 1e9:.3f} GB")
    print(
        f"wrote {done.out}: tp {done.layout.tp} x ep {done.layout.ep}, "
        f"{sum(done.rank_bytes) / 1e9:.3f} GB"
    )
    return 0


@_one_line
def cmd_attest(argv: list[str]) -> int:
    p = Parser(
        prog="python -m tpload attest",
        description="Check a load attestation (written by --attest FILE): re-derive every rank's "
        "plan from the checkpoint's headers and the attested options, recompute every rank's "
        "digest from its bytes, and compare windows, coverage, digests and the signature. Prints "
        "one line per difference (docs/attestation.md).",
    )
    sub = p.add_subparsers(dest="action", required=True)
    v = sub.add_parser("verify", help="check FILE against the checkpoint")
    v.add_argument("file", metavar="FILE")
    v.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the checkpoint the load read"
    )
    v.add_argument(
        "--key", metavar="PEM", help="the EC public key the attestation was signed with (FILE.sig)"
    )
    v.add_argument(
        "--config",
        metavar="NAME|PATH",
        help="the config to plan with (default: the attested one, as "
        "given to the load); its id must be the attested id",
    )
    args = p.parse_args(argv)
    from .verification.attest import check

    problems, notes = check(
        args.file, args.checkpoint, key=args.key, config=args.config
    )  # errors: @_one_line
    for line in notes:
        print(f"note: {printable(line)}")
    for line in problems:
        print(f"DIFFERS {printable(line)}")
    print(
        f"{printable(args.file)}: "
        + (
            f"{len(problems)} difference(s)"
            if problems
            else "OK: every rank's windows, digest and the coverage match the checkpoint"
            + (", signature verified" if args.key else "")
        )
    )
    return 1 if problems else 0


@_one_line
def cmd_bench(argv: list[str]) -> int:
    from .tools.bench import cmd_bench as bench

    return bench(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "synth": cmd_synth,
    "plan": cmd_plan,
    "verify": cmd_verify,
    "manifest": cmd_manifest,
    "bench": cmd_bench,
    "export": cmd_export,
    "attest": cmd_attest,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        return cmd_load(argv)
    except KeyboardInterrupt:
        _say("tpload: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

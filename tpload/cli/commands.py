"""Each subcommand's runner but the load's (cli/load.py): what it does with its parsed flags, and
what it prints."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from ..model.errors import LoadError
from ..model.text import escape_name, plural, printable
from ..options.flags import check_flags

if TYPE_CHECKING:  # annotations only: the command line imports the core on first use
    from ..selection.config import Config
    from ..storage.catalogue import Catalogue
    from ..verification.signing import SignedModel
from .output import capped, fail, one_line, phase_lines, progress_of
from .parsers import (
    SYNTH_DIMS,
    attest_parser,
    export_parser,
    kernels_parser,
    manifest_parser,
    plan_parser,
    synth_parser,
    verify_parser,
)


@one_line
def cmd_synth(argv: list[str]) -> int:
    from ..tools.published import PUBLISHED
    from ..tools.synth import spec_from, write_checkpoint
    from ..tools.synth_gguf import GGUF_PRESETS, HEADERS_ONLY, write_gguf_preset, write_headers_only

    p = synth_parser()
    args = p.parse_args(argv)
    if args.preset in HEADERS_ONLY and not args.headers_only:
        p.error(f"{args.preset} is written only --headers-only")
    if (
        args.preset in GGUF_PRESETS or args.preset in HEADERS_ONLY
    ):  # GGUF split sets (docs/formats/gguf.md)
        if args.preset in HEADERS_ONLY and (args.hub or args.local_dir):
            p.error("--hub and --local-dir are for presets with data")
        root = (
            write_headers_only(args.dir, args.preset)
            if args.preset in HEADERS_ONLY
            else _laid_out(
                args, lambda out: write_gguf_preset(out, args.preset, seed=args.seed or 0)
            )
        )
        print(
            f"wrote {printable(str(root))}: {len(list(root.glob('*.gguf')))} GGUF files, preset "
            f"{args.preset}"
        )
        if args.preset in GGUF_PRESETS and not (args.hub or args.local_dir):
            # GGUF carries no digests: nothing vouches for the set until a manifest does
            print(
                f"next: python -m tpload manifest {printable(str(root))}   (GGUF carries no "
                "digests: the load needs the manifest's)"
            )
        return 0
    if args.preset in PUBLISHED:
        return _synth_published(p, args)
    if args.headers_only or args.hub or args.local_dir or args.tensors:
        p.error(
            "--headers-only, --hub, --local-dir and --tensors are for the published presets "
            "(NAME-tiny, NAME-full, deepseek-v3-deep, many-tensors)"
        )
    try:
        spec = spec_from(args.preset, **{f: getattr(args, f) for f in SYNTH_DIMS})
    except ValueError as e:
        p.error(str(e))
    root = write_checkpoint(args.dir, spec, progress=progress_of("synth"))
    size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    print(f"wrote {root}: {size / 1e9:.3f} GB ({spec})")
    return 0


def _laid_out(args: argparse.Namespace, write: Callable[[Path], Path]) -> Path:
    """``write(folder)`` (a preset, without a manifest) into DIR: as a hub cache (``--hub``), as a
    local-dir download (``--local-dir``), else as it writes it."""
    from ..tools.synth import write_hub, write_local_dir

    if args.hub:
        return write_hub(args.dir, args.hub, write)
    if args.local_dir:
        return write_local_dir(args.dir, args.preset, write)
    return write(Path(args.dir))


def _synth_published(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..tools.published import PUBLISHED, write_published

    if any(getattr(args, f) is not None for f in SYNTH_DIMS if f != "seed"):
        p.error("the published presets take no dimension flags (their dimensions are the family's)")
    full = PUBLISHED[args.preset]().headers_only
    if full != args.headers_only:
        p.error(f"{args.preset} {'is written only' if full else 'is not written'} --headers-only")
    if (args.hub or args.local_dir) and full:
        p.error("--hub and --local-dir are for presets with data")
    progress = progress_of("synth")
    if args.hub or args.local_dir:
        root = _laid_out(
            args,
            lambda out: write_published(
                out,
                args.preset,
                seed=args.seed or 0,
                manifest=False,
                tensors=args.tensors,
                progress=progress,
            ),
        )
    else:
        root = write_published(
            args.dir, args.preset, seed=args.seed or 0, tensors=args.tensors, progress=progress
        )
    shards = list(root.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in shards)
    used = sum(f.stat().st_blocks * 512 for f in shards)
    print(
        f"wrote {printable(str(root))}: {len(shards)} shards, {size / 1e9:.3f} GB "
        f"({used / 1e9:.3f} GB on disk), preset {args.preset}"
    )
    return 0


def _require(root: str) -> None:
    """A checkpoint path that is not there, said before anything is read or chosen for it."""
    if not os.path.exists(root):
        raise LoadError(f"{escape_name(root)}: checkpoint directory does not exist")


def _gpu_memory(asked: float | None) -> tuple[int, str] | None:
    """The GPU size ``plan`` judges the peaks against: ``--gpu-memory``, else this machine's first
    CUDA device's, else none (no verdict on a machine without a GPU: its size is not known)."""
    if asked is not None:
        return int(asked * 2**30), f"--gpu-memory {asked:g}"
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
    except RuntimeError:  # a driver that cannot start: the plan stands without a verdict
        return None
    return int(props.total_memory), f"this machine's cuda:0, {printable(props.name)}"


def _config_for(args: argparse.Namespace, root: str, *, out: TextIO | None = None) -> Config:
    """The config ``--config`` names for the checkpoint at ``root`` (auto: found from its files,
    saying why, on ``out``: standard output, or standard error under ``--json``)."""
    from ..loading.pick import choose_pinned
    from ..selection.config import with_rules

    config, why = choose_pinned(getattr(args, "config", None) or "auto", Path(root).absolute())
    if why:
        print(printable(why), file=out or sys.stdout)
    return with_rules(
        config,
        skip=tuple(getattr(args, "skip", ()) or ()),
        defer=tuple(getattr(args, "defer", ()) or ()),
        skip_activation_scales=getattr(args, "skip_activation_scales", False),
    )


DOES_NOT_FIT = 3
"""``plan``'s exit code when a rank's peak is over the GPU it is judged against (README's exit
codes): a script can gate a launch on it, apart from a plan that failed (1)."""


def _human(args: argparse.Namespace) -> TextIO:
    """Where a command's human text goes: standard output, or standard error when ``--json`` gives
    standard output to the JSON."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def _json_out(doc: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()


@one_line
def cmd_kernels(argv: list[str]) -> int:
    """Compile the kernels ahead into the folder numba keeps their cache in (kernels/build.py), and
    check the module loads."""
    args = kernels_parser().parse_args(argv)
    from ..kernels import ahead
    from .kernel_cache import kernel_cache

    folder = kernel_cache()
    module, _ = ahead.paths(folder)
    if not args.force and ahead.find([folder]) is not None:
        print(f"tpload's kernels are compiled ahead already: {module}")
        return 0
    from ..kernels.build import build

    t = time.perf_counter()
    module = build(folder)
    if ahead.load([folder]) is None:
        raise LoadError(f"{module}: built, but it does not load (the warning above says why)")
    print(f"compiled tpload's kernels ahead in {time.perf_counter() - t:.1f} s: {module}")
    return 0


@one_line
def cmd_plan(argv: list[str]) -> int:
    p = plan_parser()
    args = p.parse_args(argv)
    check_flags(args, checkpoint=args.dir if args.write else None)  # --write: the store's place
    out = _human(args)
    t0 = time.monotonic()
    first = (
        f"plan {printable(args.dir)} at tp {args.tp} x ep {args.ep}: open, then plan "
        "(torch's import first)"
    )
    stack = contextlib.ExitStack()  # the phases' lines end with the try
    try:
        _require(args.dir)
        phases = stack.enter_context(phase_lines("plan", first))
        phases.enter("open")
        from ..model.values import Layout
        from ..tools.sizing import HostMemory, costs, fit_line, planning, render_costs

        imported = time.monotonic() - t0
        config = _config_for(args, args.dir, out=out)
        layout = Layout(args.tp, args.ep)
        per_node = args.nproc_per_node or layout.world
        t1, host = time.monotonic(), HostMemory()
        phases.enter("plan")
        with planning(args.dir, config, layout) as planner:
            host.classified()
            plans = [planner.plan(layout, args.kind, r) for r in range(layout.world)]
            # the planner of an opened checkpoint holds its storage's catalogue
            catalogue = cast("Catalogue", planner.catalogue)
            ranks, nodes = costs(plans, catalogue, per_node)
            host.planned(len(plans))
            notes = planner.notes()
        seconds = time.monotonic() - t1
        phases.enter("read")  # --write and --digest read every window: their own progress
        path = None
        if (
            args.write or args.digest
        ):  # the load's own code (numba's kernels): imported only to run it
            from ..attest.predict import predict
            from ..tools.offline import record_verified
        if args.write:
            digests, path = record_verified(
                args.dir,
                config,
                layout,
                args.kind,
                store=getattr(args, "digest_store", None),
                progress=progress_of("plan --write"),
            )
        else:
            digests = (
                predict(args.dir, config, layout, args.kind, progress=progress_of("plan --digest"))
                if args.digest
                else ["-"] * len(plans)
            )
        gpu = _gpu_memory(args.gpu_memory)
    except LoadError as e:
        return _failed(args, e)
    finally:
        stack.close()
    say = functools.partial(print, file=out)
    say(
        f"plan for {printable(args.dir)} (config {printable(config.name)}, tp {args.tp} x ep "
        f"{args.ep}, kind {args.kind}, {plural(len(nodes), 'node')} of "
        f"{plural(per_node, 'rank')})"
    )
    if config.description:
        say(f"config {printable(config.name)}: {printable(config.description)}")
    for line in notes:  # the weight prefix, the KV-cache scale census, the activation scales
        say(printable(line))
    say(
        render_costs(
            ranks,
            nodes,
            digests,
            host,
            every_rank=(args.ranks or ("all" if len(plans) <= 16 else "summary")) == "all",
            headers_only=catalogue.headers_only,
            fit=fit_line(ranks, *gpu) if gpu is not None else None,
        )
    )
    if args.replicas > 1:
        from ..distributed.replica_split import plan_lines

        say("\n".join(plan_lines(plans, args.replicas, per_node)))
    say(
        f"planned {plural(len(plans), 'rank')} of {plural(len(catalogue.tensors), 'tensor')} in "
        f"{seconds:.2f} s (headers, classification, plans, figures; imports {imported:.2f} s "
        f"before); peak RSS {host.peak / 2**30:.2f} GiB"
    )
    if path is not None:
        say(
            f"wrote {path}: every tensor checked by sha256 first; loads with this layout, kind "
            "and config are checked against these digests, and --verify digest loads may trust "
            "them in place of hashing"
        )
    over = [r.rank for r in ranks if gpu is not None and r.device_peak > gpu[0]]
    if args.json:
        _json_out(
            {
                "checkpoint": args.dir,
                "config": config.name,
                "tp": args.tp,
                "ep": args.ep,
                "kind": str(args.kind),
                "notes": list(notes),
                "ranks": [
                    dataclasses.asdict(r)
                    | {"device_peak": r.device_peak, "digest": d if d != "-" else None}
                    for r, d in zip(ranks, digests, strict=True)
                ],
                "nodes": [dataclasses.asdict(n) for n in nodes],
                "gpu": None
                if gpu is None
                else {"bytes": gpu[0], "source": gpu[1], "fits": not over, "over": over},
                "digests_written": str(path) if path is not None else None,
            }
        )
    return DOES_NOT_FIT if over else 0


def _failed(args: argparse.Namespace, e: LoadError) -> int:
    """A command's failure: its one line on standard error, the problems capped there
    (:func:`~tpload.cli.output.fail`); under ``--json`` the whole of it, every problem, on
    standard output too."""
    if getattr(args, "json", False):
        lines = str(e).splitlines()
        _json_out({"ok": False, "error": lines[0] if lines else "", "lines": lines[1:]})
    return fail(e)


def _signed(
    args: argparse.Namespace, root: str, *, out: TextIO | None = None
) -> SignedModel | None:
    """A signed folder's model.sig, verified with the signer options as a load verifies it (None:
    no bundle, or ``--signature none``); a signer option that nothing uses is said in a note. Raises
    LoadError for a signed folder without a signer, or a signature that does not verify."""
    from ..verification import signing

    notes: list[str] = []
    signed = signing.precheck(signing.SignerOptions.of(args, root), notes=notes)
    for line in notes:
        print(f"note: {printable(line)}", file=out or sys.stdout)
    return signed


@one_line
def cmd_verify(argv: list[str]) -> int:
    args = verify_parser().parse_args(argv)
    check_flags(args)
    out = _human(args)
    try:
        _require(args.dir)
        first = f"verify {printable(args.dir)}: open, then hash every tensor (torch's import first)"
        with phase_lines("verify", first) as phases:
            phases.enter("open")
            from ..tools.offline import verify_checkpoint

            signed = _signed(args, args.dir, out=out)
            config = None if args.config == "none" else _config_for(args, args.dir, out=out)
            phases.enter("hash")
            problems = verify_checkpoint(
                args.dir,
                config,
                threads=args.threads,
                signed=signed,
                progress=progress_of("verify hash"),
            )
    except LoadError as e:
        return _failed(args, e)
    for line in capped([f"BAD {printable(line)}" for line in problems]):
        print(line, file=out)
    checked = printable(_verified(args.dir, config, signed)) if not problems else None
    if checked:
        print(checked, file=out)
    verdict = "OK" if not problems else f"{len(problems)} problem(s)"
    print(f"{printable(args.dir)}: {verdict}", file=out)
    if args.json:
        _json_out(
            {
                "checkpoint": args.dir,
                "ok": not problems,
                "config": config.name if config is not None else None,
                "checked": checked,
                "problems": list(problems),
            }
        )
    return 1 if problems else 0


def _verified(root: str, config: Config | None, signed: SignedModel | None = None) -> str:
    """What a passing ``verify`` checked and what vouched for it, counted from the headers (no data
    read again; the checkpoint just passed, so it opens)."""
    from ..model.values import MANIFEST_NAME
    from ..storage.files import read_json
    from ..storage.partitioned import PartitionedStorage, is_partitioned
    from ..storage.sharded import ShardedStorage

    path = Path(root).absolute()
    if is_partitioned(path):
        doc = read_json(path / MANIFEST_NAME, "export manifest")
        meta = cast(dict[str, object], doc)["partitioned"] if isinstance(doc, dict) else {}
        if not isinstance(meta, dict):
            raise LoadError(f"{escape_name(path)}: its export manifest names no partitioning")
        tp, ep = int(meta["tp"]), int(meta["ep"])
        count = nbytes = 0
        for rank in range(tp * ep):
            part = PartitionedStorage(path, tp=tp, ep=ep, rank=rank, world=tp * ep)
            try:
                count += len(part.windows)
                nbytes += sum(part.stored(n).nbytes for n in part.windows)
            finally:
                part.close()
        return (
            f"checked {count:,} windows in {tp * ep} rank file(s), {nbytes / 1e9:.3f} GB: each "
            f"window's sha256 against the export's {MANIFEST_NAME}"
        )
    storage = ShardedStorage(path)
    try:
        cat = storage.catalogue
        names = cat.names()
        nbytes = sum(cat.get(n).nbytes for n in names)
        by = f"{signed.bundle.name} (signer {signed.signer_id})" if signed is not None else ""
        if signed is not None and not signed.manifest_sha256:
            vouch = f"each of its {len(storage.paths())} files whole against the digests {by} signs"
        elif storage.file_digests is not None and signed is None:
            source = storage.file_source  # set with the digests (a hub snapshot, a download)
            each = source.each if source is not None else "their recorded digests"
            vouch = f"each of its {len(storage.file_digests)} files whole, by sha256 against {each}"
        else:
            signer = f", the manifest signed by {by}" if signed is not None else ""
            vouch = f"each tensor by sha256 against {MANIFEST_NAME} ({_pin(cat.manifest_sha256)})"
            vouch += signer
    finally:
        storage.close()
    values = (
        f"; values (scales, NaN codes, bf16 overflow) by config {config.name}"
        if config is not None
        else "; no value checks (--config none)"
    )
    return f"checked {len(names):,} tensors, {nbytes / 1e9:.3f} GB: {vouch}{values}"


def _pin(sha256: str | None) -> str:
    """The flag that pins a load to the manifest, with its whole sha256 (README: pin it from
    outside the folder)."""
    return f"pin loads to it with --manifest-sha256 {sha256 or '?'}"


@one_line
def cmd_manifest(argv: list[str]) -> int:
    args = manifest_parser().parse_args(argv)
    check_flags(args, checkpoint=args.dir if args.hash == "blake3" else None)
    try:
        _require(args.dir)
        from ..model.values import MANIFEST_NAME
        from ..storage.files import folder_of
        from ..storage.pins import Pins
        from ..tools.offline import write_blake3, write_manifest

        blake3 = args.hash == "blake3"
        if blake3:
            from ..verification.hashes import require

            require()  # before hours of hashing
        signed = _signed(args, args.dir)  # a signed folder: nothing written over unsigned bytes
        if (
            not blake3
            or args.force
            or not os.path.lexists(folder_of(Path(args.dir).absolute()) / MANIFEST_NAME)
        ):
            written = write_manifest(
                args.dir,
                force=args.force,
                threads=args.threads,
                signed=signed,
                progress=progress_of("manifest"),
            )
            sha = Pins.of(written.parent).manifest_sha256
            print(f"wrote {printable(str(written))}; {_pin(sha)}")
            if signed is not None and signed.covers(MANIFEST_NAME):
                print(
                    f"note: {printable(signed.bundle.name)} signs the {MANIFEST_NAME} this "
                    "replaced: loads of the folder fail until it is signed again"
                )
        if blake3:
            side = write_blake3(
                args.dir,
                threads=args.threads,
                store=getattr(args, "digest_store", None),
                progress=progress_of("manifest --hash blake3"),
                signed=signed,
            )
            print(
                f"wrote {printable(str(side))}: every tensor's sha256 matched the manifest; loads "
                "(--verify node or rank) now check bytes by blake3 against it"
            )
    except LoadError as e:
        return fail(e)
    return 0


@one_line
def cmd_export(argv: list[str]) -> int:
    args = export_parser().parse_args(argv)
    try:
        _require(args.dir)
        from ..model.values import Layout
        from ..storage.partitioned import rank_file
        from ..tools.export import export

        done = export(
            args.dir,
            args.out,
            Layout(args.tp, args.ep),
            _config_for(args, args.dir),
            hash_threads=getattr(args, "hash_threads", None),
            progress=progress_of("export"),
        )
    except LoadError as e:
        return fail(e)
    for rank, n in enumerate(done.rank_bytes):
        print(f"rank {rank}: {rank_file(rank, done.layout.world)} {n / 1e9:.3f} GB")
    print(
        f"wrote {done.out}: tp {done.layout.tp} x ep {done.layout.ep}, "
        f"{sum(done.rank_bytes) / 1e9:.3f} GB"
    )
    return 0


@one_line
def cmd_attest(argv: list[str]) -> int:
    parser = attest_parser()
    args = parser.parse_args(argv)
    if args.dir and args.checkpoint and args.dir != args.checkpoint:
        parser.error(f"DIR {args.dir!r} and --checkpoint {args.checkpoint!r} name two checkpoints")
    args.checkpoint = args.dir or args.checkpoint
    if not args.checkpoint:
        parser.error("attest verify needs DIR, the checkpoint the load read")
    _require(args.checkpoint)
    check_flags(args)
    from ..attest.check import check
    from ..verification.signing import SignerOptions

    checked = check(
        args.file,
        args.checkpoint,
        key=args.key,
        config=args.config,
        progress=progress_of("attest verify"),
        require_whole=args.require_whole,
        signer=SignerOptions.of(args, args.checkpoint),
    )  # errors: @one_line
    for line in checked.notes:
        print(f"note: {printable(line)}")
    for line in checked.problems:
        print(f"DIFFERS {printable(line)}")
    if checked.problems:
        print(f"{printable(args.file)}: {len(checked.problems)} difference(s)")
        return 1
    ok = "OK: every rank's windows, digest and the coverage match the checkpoint" + (
        ", signature verified" if args.key else ""
    )
    print(
        f"{printable(args.file)}: {ok}"
        + (f"; partial: {printable(checked.partial)}" if checked.partial else "; whole")
    )
    return 0


@one_line
def cmd_bench(argv: list[str]) -> int:
    if "--engine" in argv:  # a serving engine's default loader beside tpload's (bench_engine.py)
        from ..tools.bench_engine import cmd_bench_engine

        return cmd_bench_engine(argv)
    if "--replicas" in argv:  # replicas sharing the reads against each reading alone
        from ..tools.bench_replicas import cmd_bench_replicas

        return cmd_bench_replicas(argv)
    from ..tools.bench import cmd_bench as bench

    return bench(argv)

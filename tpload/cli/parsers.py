"""Every subcommand's parser. The load's flags (and those the subcommands share with it) come from
the options table (:func:`tpload.options.flags.add_flags`); the rest are each subcommand's own."""

from __future__ import annotations

import argparse
import os
import typing

from .. import __version__
from ..model.bounds import COUNT, GIB, RANKS, SEED, THREADS
from ..model.values import SIGNER_FIELDS
from ..options import flags
from ..options.flags import add_cli_only, add_flags
from ..options.load_options import KINDS
from .output import once_a_node


class Parser(flags.Parser):
    """The command line's parsers: under torchrun every rank parses the same flags, so a bad one is
    said once a node (:func:`~tpload.cli.output.once_a_node`), and every rank exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        rank = os.environ.get("RANK", "?")
        once_a_node(self.error_line(message), f"[rank {rank}] tpload: bad flags (see local rank 0)")
        self.exit(2)


SUBCOMMANDS = ("synth", "plan", "verify", "manifest", "bench", "export", "attest", "kernels")
"""``python -m tpload NAME ...``; anything else is the load's flags."""
SYNTH_DIMS = ("hidden", "inter", "experts", "stages", "vocab", "block", "shards", "seed")
"""The reference layout's dimensions ``synth`` takes as flags."""
SYNTH_HELP = {
    "hidden": "(small, medium, seed) the hidden size",
    "inter": "(small, medium, seed) each expert's intermediate size",
    "experts": "(small, medium, seed) routed experts per layer",
    "stages": "(small, medium, seed) how many MTP stages (layers)",
    "vocab": "(small, medium, seed) the vocabulary (embedding and head rows)",
    "block": "(small, medium, seed) the FP8 scale block",
    "shards": "(small, medium, seed) how many safetensors files",
    "seed": "the random seed of the values (every preset; default 0)",
}
"""Each dimension's ``--help`` line."""


def load_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload",
        usage="torchrun --nproc-per-node N -m tpload [DIR] [flags]   (or: python -m tpload "
        "SUBCOMMAND ...)",
        description="Load every rank's verified shards of a checkpoint (run under torchrun; "
        "README.md's Options table has every flag).",
        epilog="subcommands: "
        + ", ".join(SUBCOMMANDS)
        + "; `python -m tpload SUBCOMMAND --help` for each (synth: a synthetic checkpoint, plan: "
        "what each rank reads and holds, verify: check at rest, manifest: write "
        "NATIVE_MANIFEST.json, bench, export: pre-partition, attest verify: check an "
        "attestation, kernels: compile the CPU kernels ahead)",
    )
    p.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help="checkpoint directory or .gguf file (or --checkpoint DIR)",
    )
    add_flags(p, grouped=True)
    add_cli_only(p.add_argument_group("the command line"), __version__)
    return p


def synth_parser() -> argparse.ArgumentParser:
    from ..tools.published import PUBLISHED
    from ..tools.synth import PRESETS
    from ..tools.synth_gguf import GGUF_PRESETS, HEADERS_ONLY

    p = Parser(
        prog="python -m tpload synth",
        description="Write a synthetic checkpoint. small, medium, seed: the reference native "
        "layout of docs/format.md (shards, index and NATIVE_MANIFEST.json; no config.json: a load "
        "reads it as that layout). NAME-tiny, deepseek-v3-deep, many-tensors: a published "
        "family's layout (docs/formats/: shards, index, config.json, any quantization file, and "
        "NATIVE_MANIFEST.json). NAME-full --headers-only: the same headers at full size, with "
        "holes for data and no manifest. NAME-gguf-tiny: a GGUF split set (no manifest).",
    )
    p.add_argument("dir", metavar="DIR", help="a new or empty folder")

    p.add_argument(
        "--preset",
        choices=list(PRESETS) + list(PUBLISHED) + list(GGUF_PRESETS) + list(HEADERS_ONLY),
        default="small",
        metavar="NAME",
        help="the layout to write (default small): "
        + ", ".join(list(PRESETS) + list(PUBLISHED) + list(GGUF_PRESETS) + list(HEADERS_ONLY)),
    )
    p.add_argument(
        "--headers-only",
        action="store_true",
        help="(NAME-full presets) real headers and index, holes "
        "for data: sparse files that use no disk; only `plan` reads them",
    )
    layout = p.add_mutually_exclusive_group()
    layout.add_argument(
        "--hub",
        metavar="ORG/NAME",
        help="(published and GGUF presets) lay the files out as a hub cache under DIR (blobs named "
        "by hash, snapshots/REV linking to them), without a manifest; load the printed folder",
    )
    layout.add_argument(
        "--local-dir",
        action="store_true",
        help="(published and GGUF presets) lay DIR out as `hf download ORG/NAME --local-dir DIR` "
        "leaves it (each file's etag in DIR/.cache/huggingface/download, written by "
        "huggingface_hub), without a manifest; load DIR",
    )
    for f in SYNTH_DIMS:
        p.add_argument(
            f"--{f}", type=SEED if f == "seed" else COUNT, metavar="N", help=SYNTH_HELP[f]
        )
    p.add_argument(
        "--tensors",
        type=COUNT,
        metavar="N",
        help="(many-tensors[-alternating]) how many tiny 8x8 tensors (default 10000)",
    )
    return p


def plan_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload plan",
        description="Print every rank's plan without a GPU "
        "(reads, hashing, device and host memory; each node's share); with --digest the digests "
        "a load must produce (computed on the CPU by the load's code).",
    )
    p.add_argument("dir", metavar="DIR", help="the checkpoint folder (or .gguf file) to plan")
    p.add_argument(
        "--tp",
        type=RANKS,
        required=True,
        help="tensor-parallel degree: how many ranks cut each matrix",
    )
    p.add_argument(
        "--ep",
        type=RANKS,
        default=1,
        help="expert-parallel degree: how many groups the experts are split among (ranks = tp x "
        "ep; default 1)",
    )
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="packed",
        help="packed: the stored bytes (FP4/FP8 weights with their scales); expanded: bf16 decodes "
        "(default packed)",
    )
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
    p.add_argument(
        "--gpu-memory",
        type=GIB,
        metavar="GIB",
        default=None,
        help="the memory of one GPU, in GiB, for a line saying whether each rank's peak fits it "
        "(default: this machine's GPU, cuda:0; none on a machine without CUDA)",
    )
    p.add_argument("--digest", action="store_true", help="compute each rank's digest on the CPU")
    p.add_argument(
        "--json",
        action="store_true",
        help="the plan as JSON on standard output (every rank, node and the fit; the text on "
        "standard error)",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="check every tensor by sha256, then keep the digests in the "
        "digest store (implies --digest); --verify digest loads may then trust them",
    )
    return p


def verify_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload verify",
        description="Check a checkpoint at rest: headers, "
        "index, manifest, every sha256, scale bytes, NaN codes and overflowing decodes; list "
        "every bad tensor. An export is checked rank file by rank file.",
    )
    p.add_argument("dir", metavar="DIR", help="the checkpoint folder (or .gguf file) to check")
    p.add_argument(
        "--config",
        default="auto",
        help="roles for the value checks (auto: from DIR's config.json; 'none' to skip them)",
    )
    p.add_argument(
        "--threads", type=THREADS, default=2, help="hash worker threads (0: on the main thread)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="the verdict and every problem as JSON on standard output (the text on standard "
        "error)",
    )
    add_flags(p, only=SIGNER_FIELDS)  # a signed DIR: checked against its model.sig, as a load
    return p


def manifest_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload manifest",
        description="Hash every tensor and write "
        "NATIVE_MANIFEST.json for a checkpoint that lacks one; with --hash blake3, also keep "
        "a blake3 of every tensor in the digest store, after checking each one's sha256 "
        "against the manifest (loads then hash with blake3).",
    )
    p.add_argument(
        "dir", metavar="DIR", help="the checkpoint folder (or .gguf file) to write it for"
    )
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
    add_flags(p, only=("digest_store", *SIGNER_FIELDS))
    return p


def export_parser() -> argparse.ArgumentParser:
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
    return p


def attest_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload attest",
        description="Check a load attestation (written by --attest FILE): re-derive every rank's "
        "plan from the checkpoint's headers and the attested options, recompute every rank's "
        "digest from its bytes, and compare windows, coverage, digests and the signature. Prints "
        "one line per difference (docs/attestation.md).",
    )
    sub = p.add_subparsers(
        dest="action",
        required=True,
        metavar="ACTION",
        title="actions",
        help="`python -m tpload attest ACTION --help` for its flags",
    )
    v = sub.add_parser("verify", help="check FILE against the checkpoint")
    v.add_argument("file", metavar="FILE", help="the attestation (--attest FILE of the load)")
    v.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        help="the checkpoint the load read (as every command takes it)",
    )
    v.add_argument("--checkpoint", metavar="DIR", help=argparse.SUPPRESS)  # the older spelling
    v.add_argument(
        "--key", metavar="PEM", help="the EC public key the attestation was signed with (FILE.sig)"
    )
    v.add_argument(
        "--config",
        metavar="NAME|PATH",
        help="the config to plan with (default: the attested one, as "
        "given to the load); its id must be the attested id",
    )
    v.add_argument(
        "--require-whole",
        action="store_true",
        help="fail (exit 1) when the attested load skipped or deferred any tensor; without it the "
        "OK line says what was left out",
    )
    add_flags(v, only=SIGNER_FIELDS)  # a signed DIR: its model.sig checked as the load checks it
    return p


def kernels_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tpload kernels",
        description="Compile tpload's CPU kernels ahead, once a machine (about 10-30 s), into one "
        "extension module kept beside numba's cache: a process's first load then loads them in "
        "milliseconds, without importing numba. A module built by another tpload, numba, Python "
        "or CPU is never used (run this again after an upgrade); without one, loads use numba's "
        "kernels as before.",
    )
    p.add_argument(
        "--force", action="store_true", help="compile again even when a valid module is there"
    )
    return p

"""Command line: ``torchrun --nproc-per-node N -m tpload [DIR] [flags]`` and the subcommands.

    python -m tpload [DIR] [--kind packed|expanded] [--tp T] ...
        load (the main job; flags: --help)
    python -m tpload synth DIR [--preset small|medium|seed] [--hidden H ...]
        write a synthetic checkpoint
    python -m tpload plan DIR --tp T [--ep E] [--kind K] [--gpu-memory GIB] [--digest [--write]]
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
    python -m tpload kernels [--force]
        compile the CPU kernels ahead (once a machine: a faster first call)

The load's flags are generated from :class:`tpload.options.load_options.LoadOptions`
(``tpload.options.flags``); each subcommand's parser is in ``parsers.py``, its runner in ``load.py``
or ``commands.py``, and how errors and logs are written in ``output.py``. The CLI sits above the
core and the tools: it is the only place that writes the built-in synthetic checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .commands import (
    cmd_attest,
    cmd_bench,
    cmd_export,
    cmd_kernels,
    cmd_manifest,
    cmd_plan,
    cmd_synth,
    cmd_verify,
)
from .load import cmd_load
from .output import say
from .parsers import SUBCOMMANDS

COMMANDS: dict[str, Callable[[list[str]], int]] = dict(
    zip(
        SUBCOMMANDS,
        (
            cmd_synth,
            cmd_plan,
            cmd_verify,
            cmd_manifest,
            cmd_bench,
            cmd_export,
            cmd_attest,
            cmd_kernels,
        ),
        strict=True,
    )
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        return cmd_load(argv)
    except KeyboardInterrupt:
        say("tpload: interrupted (Ctrl-C)")
        return 130

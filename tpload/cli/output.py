"""How the command line speaks: one line per error on stderr (one write, so ranks sharing
torchrun's stderr do not interleave), torchrun's error file, and the logging levels."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..model.errors import LoadError
from ..model.text import printable

if TYPE_CHECKING:  # annotations only: report/ imports torch, which a command may never need
    from ..model.progress import Meter
    from ..report.progress import Phases


def say(text: str) -> None:
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


SHOWN_PROBLEMS = 20
"""How many items of a list of problems the terminal shows; the rest are counted (every one is in
``--report`` and ``--json``)."""


def capped(lines: list[str], *, indent: str = "", limit: int = SHOWN_PROBLEMS) -> list[str]:
    """The first ``limit`` of ``lines``, then one counting the rest: a checkpoint with a million bad
    entries gives a screenful, not a million lines."""
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"{indent}... and {len(lines) - limit:,} more"]


def capped_text(text: str) -> str:
    """``text`` with each run of list items (lines starting ``- `` at one indent, as
    :func:`tpload.model.errors` lists problems) cut by :func:`capped`."""
    out: list[str] = []
    run: list[str] = []
    indent = None
    for line in [*text.split("\n"), None]:
        stripped = line.lstrip(" ") if line is not None else ""
        here = line[: len(line) - len(stripped)] if line is not None else None
        if line is not None and stripped.startswith("- ") and (not run or here == indent):
            run.append(line)
            indent = here
            continue
        out += capped(run, indent=indent or "")
        run, indent = [], None
        if line is not None:
            if stripped.startswith("- "):
                run, indent = [line], here
            else:
                out.append(line)
    return "\n".join(out)


def fail(e: BaseException, rank: str | None = None) -> int:
    prefix = f"[rank {rank}] " if rank is not None else ""
    say(f"{prefix}tpload: error: {capped_text(printable(str(e)))}")
    return 1


def fail_rank(e: LoadError, rank: str) -> int:
    """A failed load's end on one rank. A verdict every rank holds is printed in full by its
    reporter (the lowest failing rank) and pointed to by the others, so N ranks show it once; under
    torchrun it also goes to the elastic error file, so torchrun's summary shows it as the root
    cause."""
    reporter = e.reporter
    if reporter is None or str(reporter) == rank:
        line, first = f"[rank {rank}] tpload: error: {capped_text(printable(str(e)))}", True
    else:
        line, first = f"[rank {rank}] tpload: load failed (see rank {reporter})", False
    say(line)
    _error_file(line, root_cause=first or reporter is None)
    return 1


QUIET_GRACE_S = 5.0
"""How long a quiet rank waits before it exits (:func:`once_a_node`): no wait in practice, since
torchrun stops it as soon as the speaking rank exits."""


def first_on_node() -> bool:
    """Whether this process speaks for its node: the lowest local rank under torchrun, or a process
    on its own."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def once_a_node(line: str, pointer: str) -> None:
    """A fault every rank of a node finds alike (a flag, a path, the launch), said once: the node's
    lowest local rank prints ``line`` and names it in torchrun's error file; each other rank writes
    only ``pointer`` there and waits a moment before exiting, since torchrun stops every rank at
    the first exit (the speaker could be stopped before it spoke) and names that one the root
    cause."""
    if first_on_node():
        say(line)
        _error_file(line, root_cause=True)
        return
    _error_file(pointer, root_cause=False)
    time.sleep(QUIET_GRACE_S)


def refuse_launch(message: str, rank: str) -> int:
    """A load refused before it starts (no rendezvous, no heavy imports): one line a node, exit 1
    on every rank."""
    once_a_node(
        f"[rank {rank}] tpload: error: {printable(message)}",
        f"[rank {rank}] tpload: refused before the load (see local rank 0)",
    )
    return 1


def progress_of(command: str) -> Meter:
    """``command``'s progress, as a load's (report/progress.py): a bar on a terminal, else a log
    line every few seconds, both on stderr; tpload's log at INFO, so the lines show."""
    from ..report.progress import meter

    configure_logging("INFO")
    return meter(command)


@contextlib.contextmanager
def phase_lines(command: str, first: str) -> Iterator[Phases]:
    """``command``'s phases on standard error: ``first`` now (before torch's import, which alone
    takes seconds), then a line every few seconds for a phase that has no progress of its own
    (``verify open: 6 s``); the command enters each phase (``phases.enter("open")``)."""
    from ..report.progress import Phases, Ticker

    configure_logging("INFO")
    logging.getLogger("tpload").info("%s", first)
    phases = Phases()
    ticker = Ticker(phases, label=command).start()
    try:
        yield phases
    finally:
        ticker.stop()


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
    # written whole or not at all (a temporary file renamed over it): a rank stopped by torchrun's
    # SIGTERM between opening and writing would leave an empty file, and torchrun's summary fails
    # on it with a JSONDecodeError instead of naming the root cause
    from ..storage.files import atomic_write

    try:
        atomic_write(Path(path), json.dumps(doc))
    except OSError as e:  # the message is on stderr already: the summary only loses it
        say(f"tpload: could not write torchrun's error file {printable(path)}: {e.strerror}")


def configure_logging(spec: str) -> None:
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


def one_line(cmd: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """A subcommand that ends in one line whatever fails: its own errors (LoadError), the system's
    (a full disk, a file in the way: named by path) and, for a bug, its type and message (the
    traceback with TPLOAD_TRACEBACK=1)."""

    @functools.wraps(cmd)
    def run(argv: list[str]) -> int:
        rank = os.environ.get("RANK")
        try:
            return cmd(argv)
        except LoadError as e:
            return fail(e, rank)
        except OSError as e:
            where = f"{e.filename}: " if e.filename is not None else ""
            to = f" -> {e.filename2}" if e.filename2 is not None else ""
            return fail(LoadError(f"{where}{e.strerror or e}{to}"), rank)
        except Exception as e:
            if os.environ.get("TPLOAD_TRACEBACK"):
                raise
            return fail(
                LoadError(
                    f"unexpected {type(e).__name__}: {e} (a bug in tpload; TPLOAD_TRACEBACK=1 "
                    "shows where)"
                ),
                rank,
            )

    return run

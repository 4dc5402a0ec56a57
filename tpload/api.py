"""The one door for callers: :func:`load` returns this rank's verified shards, or raises on
every rank.

    shards = tpload.load(DIR, config="deepseek-v4-mtp", kind="expanded")
    shards.state_dict()   # {official name: this rank's tensor on its device}
    shards.report         # figures of every rank (the same table on each)
    shards.release()      # frees every buffer the load made

One call is one fixed sequence on each rank (loading/sequence.py), whose verdict is the same on
every rank (verification/gate.py owns it); what builds on a passed verdict, the load attestation
(``attest=``), is written here, after it (attest/build.py).
"""

from __future__ import annotations

import logging
import os
from typing import Unpack

import torch.distributed as dist

from .attest import build as attest
from .distributed.world import DistContext, call_world, context
from .loading import sequence
from .loading.shards import RankShards
from .model.errors import LoadError, OptionsError
from .model.progress import ProgressSink
from .options.load_options import LoadKwargs, LoadOptions

__all__ = ["load", "load_in"]


def load(
    checkpoint: str | os.PathLike[str] | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    cpu_group: dist.ProcessGroup | None = None,
    progress_sink: ProgressSink | None = None,
    **options: Unpack[LoadKwargs],
) -> RankShards:
    """Load this rank's verified shards of ``checkpoint``; the keywords are :class:`LoadOptions`'
    fields (typed for the caller's checker and IDE by :class:`LoadKwargs`; their defaults, help and
    rules are the fields').

    Ranks are counted in ``group`` (default: the world); the exchange runs on ``cpu_group``
    (default: ``group`` if it has a CPU backend). Under torchrun without a world it makes the
    default group (``cpu:gloo,cuda:nccl``) for this call only and destroys it before returning.
    Raises :class:`LoadError` on every rank if any rank fails; ``progress_sink`` replaces rank 0's
    progress (one call per tensor)."""
    error: LoadError | None = None
    try:
        opts = LoadOptions.for_load(checkpoint, options)
    except LoadError as e:  # still reach the exchange with it, so no peer waits
        opts, error = None, e
    if group is not None or cpu_group is not None:
        return load_in(opts, context(group, cpu_group), error=error, progress_sink=progress_sink)
    alone = not_launched(opts)
    if alone is not None:  # one process, no group: nothing to meet, so say it before anything
        raise OptionsError(alone)
    with call_world(timeout_s=opts.timeout_s if opts else LoadOptions().timeout_s):
        return load_in(opts, context(), error=error, progress_sink=progress_sink)


def not_launched(opts: LoadOptions | None) -> str | None:
    """What is wrong with a load of several ranks called in a process no launcher started (no
    WORLD_SIZE, no process group), in the API's words: the load would be a group of one."""
    if opts is None or "WORLD_SIZE" in os.environ or dist.is_initialized():
        return None
    ranks, degrees = opts.ranks_asked()
    if ranks <= 1:
        return None
    asked = ", ".join(f"{name}={n}" for name, n in degrees)
    return (
        f"load({asked}) needs {ranks} ranks, one process each, but this process was not started "
        f"by torchrun: run the script that calls load() with torchrun --nproc-per-node {ranks} "
        f"SCRIPT.py (every process calls it alike), or pass group= a process group of {ranks} "
        "ranks; in this process alone, load() without tp"
    )


def load_in(
    opts: LoadOptions | None,
    ctx: DistContext,
    *,
    error: LoadError | None = None,
    progress_sink: ProgressSink | None = None,
) -> RankShards:
    """:func:`load` in an existing context (``ctx``: this rank's group; the command line's): the
    load's sequence, then, after its passed verdict, the attestation when asked."""
    loaded = sequence.load_in(opts, ctx, error=error, progress_sink=progress_sink)
    attest.after_verdict(loaded)  # rank 0 writes it; every rank fails if it could not
    return loaded.shards


logging.getLogger("tpload").addHandler(logging.NullHandler())

"""What a passed load hands its caller: this rank's verified shards (the gate's main exit type)."""

from __future__ import annotations

import contextlib
import os

import torch

from .deferred import DeferredTensor
from .distributed import DistContext
from .errors import LoadError
from .loop import LoadResult
from .options import LoadOptions
from .plan import RankPlan
from .report import LoadReport, RankFigures, rank_log
from .teardown import give_back
from .text import escape_name
from .verification.gate import Verdict, Verify


class RankShards:
    """This rank's verified shards. ``state_dict()`` is a view of one preallocated arena.

    Made only from a passing :class:`~tpload.verification.gate.Verdict` (the constructor checks):
    no code path can wrap a load's arena in shards the gate did not pass."""

    def __init__(self, result: LoadResult, plan: RankPlan, report: LoadReport, verdict: Verdict,
                 deferred: tuple[DeferredTensor, ...] = ()) -> None:
        if not isinstance(verdict, Verdict):
            raise LoadError("shards are made only from the gate's verdict")
        verdict.require()
        self._result: LoadResult | None = result
        self.plan = plan
        self.report = report
        self.vouched_by = verdict.vouched_by
        """What vouched for the served bytes, in words."""
        self._deferred = deferred

    def state_dict(self) -> dict[str, torch.Tensor]:
        """{official name: this rank's tensor on its device}; views, not copies."""
        if self._result is None:
            raise LoadError("these shards were released")
        return dict(self._result.tensors)

    @property
    def hashed(self) -> list[str]:
        """Official tensors this rank checked by sha256 (its share of the node's hashing)."""
        return sorted(self._result.hashed) if self._result is not None else []

    def deferred(self) -> list[DeferredTensor]:
        """A locator (file, offset, length, dtype, shape, the sha256 its bytes must hash to) for each
        deferred tensor this rank holds, in natural name order; they are not in :meth:`state_dict`."""
        return list(self._deferred)

    def release(self) -> None:
        """Free every buffer the load made: the arena (each served and decoded tensor is a
        view of it; views the caller still holds keep it alive), the allocators' cached
        device blocks and pinned staging buffers, and freed host heap pages."""
        self._result = None
        give_back(torch.device(self.report.device))


def served(opts: LoadOptions, ctx: DistContext, plan: RankPlan, result: LoadResult, deferred: tuple,
           ranks: list[RankFigures], notes: list[str], verdict: Verdict, planner: object = None,
           chosen: object = None) -> RankShards:
    """After a verdict that passed: the report and the attestation (written by rank 0 when asked; ``planner``
    and ``chosen``, the load's planner and gate strategy, for the attestation), and this rank's shards."""
    report = LoadReport(str(opts.checkpoint), opts.kind, plan.layout.tp, plan.layout.ep, opts.verify,
                        str(ctx.device), ranks, ctx.rank, trusted=opts.verify == Verify.DIGEST,
                        evict_page_cache=opts.evict_page_cache, notes=notes)
    if opts.verify == Verify.OFF:
        rank_log(ctx.rank).warning("verification is OFF: %d tensors served without any check against the "
                                   "manifest", ranks[ctx.rank].tensors)
    if opts.report and ctx.rank == 0:
        try:
            report.write(opts.report)
        except OSError as e:
            rank_log(ctx.rank).warning("could not write the report %s: %s", escape_name(opts.report), e.strerror)
    if opts.attest and ctx.rank == 0:
        _attest(opts, ranks, planner, plan, chosen, verdict)
    return RankShards(result, plan, report, verdict, deferred)


def _attest(opts: LoadOptions, ranks: list[RankFigures], planner: object, plan: RankPlan, chosen: object,
            verdict: Verdict) -> None:
    """Rank 0 writes the attestation of a passed load. Its options were checked before loading (key, folder),
    so only the write itself can fail here, on rank 0 alone: the peers already hold their shards, so it is
    a warning, like the report's, and no older statement is left at the path to be mistaken for this one."""
    verdict.require()  # an exit path of the gate: only a passed verdict is attested
    from .verification import attest
    try:
        path = attest.after_load(opts, ranks, planner, plan.layout, chosen, verdict.vouched_by)
        rank_log(0).info("wrote the load attestation %s%s", escape_name(path),
                         f" (signed: {escape_name(attest.signature_path(path))})" if opts.attest_key else "")
    except (OSError, LoadError) as e:
        for stale in (opts.attest, attest.signature_path(opts.attest)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        rank_log(0).warning("could not write the load attestation %s: %s", escape_name(opts.attest),
                            getattr(e, "strerror", None) or e)

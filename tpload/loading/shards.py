"""What a passed load hands its caller: this rank's verified shards (the gate's main exit type)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..distributed.world import DistContext
from ..model.errors import LoadError
from ..model.figures import RankFigures
from ..model.modes import Verify
from ..model.text import escape_name
from ..options.load_options import LoadOptions
from ..planning.planner import Planner, RankPlan
from ..report.log import rank_log
from ..report.render import LoadReport
from ..verification.gate import Verdict
from .deferred import DeferredTensor
from .result import LoadResult
from .teardown import give_back

__all__ = ["RankShards", "Released", "served"]


@dataclass(frozen=True)
class Released:
    """What :meth:`RankShards.release` freed: the load's own tensors, and the derived buffers
    apart."""

    tensors: int
    """Served tensors (views of the arena)."""
    bytes: int
    """The arena's bytes."""
    derived: int
    """Buffers registered with :meth:`RankShards.derive`."""
    derived_bytes: int
    """Their bytes outside the arena (a derived view of a served tensor frees nothing more)."""


class RankShards:
    """This rank's verified shards. ``state_dict()`` is a view of one preallocated arena.

    Made only from a passing :class:`~tpload.verification.gate.Verdict` (the constructor checks):
    no code path can wrap a load's arena in shards the gate did not pass."""

    def __init__(
        self,
        result: LoadResult,
        plan: RankPlan,
        report: LoadReport,
        verdict: Verdict,
        deferred: tuple[DeferredTensor, ...] = (),
    ) -> None:
        if not isinstance(verdict, Verdict):
            raise LoadError("shards are made only from the gate's verdict")
        verdict.require()
        self._result: LoadResult | None = result
        self.plan = plan
        self.report = report
        self.vouched_by = verdict.vouched_by
        """What vouched for the served bytes, in words."""
        self.trust = verdict.trust
        """The same as a record (model/trust.py): kind, file, sha256, signer."""
        self._deferred = deferred
        self._derived: dict[str, torch.Tensor] = {}

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
        """A locator (file, offset, length, dtype, shape, the sha256 its bytes must hash to) for
        each deferred tensor this rank holds, in natural name order; they are not in
        :meth:`state_dict`."""
        return list(self._deferred)

    def derive(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Register a buffer the model derived from served tensors (a fused concat, a transposed
        twin), so that :meth:`release` frees it with the rest; returns ``tensor``. Its name must be
        new (neither served nor derived already): it is never in :meth:`state_dict`, whose bytes
        were verified."""
        if self._result is None:
            raise LoadError(f"derive {escape_name(name)}: these shards were released")
        if not isinstance(tensor, torch.Tensor):
            raise LoadError(
                f"derive {escape_name(name)}: expected a torch.Tensor, got {type(tensor).__name__}"
            )
        if name in self._derived or name in self._result.tensors:
            what = "derived" if name in self._derived else "served"
            raise LoadError(f"derive {escape_name(name)}: a {what} tensor already has this name")
        self._derived[name] = tensor
        return tensor

    def derived(self) -> dict[str, torch.Tensor]:
        """{name: buffer} of every derived buffer registered, in order."""
        return dict(self._derived)

    def release(self) -> Released:
        """Free every buffer the load made: the arena (each served and decoded tensor is a
        view of it; views the caller still holds keep it alive), the derived buffers registered
        with :meth:`derive`, the allocators' cached device blocks and pinned staging buffers, and
        freed host heap pages. Returns what it freed (nothing the second time)."""
        freed = Released(0, 0, 0, 0)
        if self._result is not None:
            arena = {self._storage_key(t) for t in self._result.tensors.values()}
            own: dict[tuple[str, int | None, int], int] = {}
            for t in self._derived.values():
                key = self._storage_key(t)
                if key not in arena:  # a view of the arena is freed with it, not twice
                    own[key] = t.untyped_storage().nbytes()
            freed = Released(
                len(self._result.outputs),
                self.plan.arena_bytes,
                len(self._derived),
                sum(own.values()),
            )
        self._result = None
        self._derived = {}
        give_back(torch.device(self.report.device))
        return freed

    @staticmethod
    def _storage_key(t: torch.Tensor) -> tuple[str, int | None, int]:
        st = t.untyped_storage()
        return (st.device.type, st.device.index, st.data_ptr())


def failed(
    opts: LoadOptions, ctx: DistContext, ranks: list[RankFigures], notes: list[str], error: str
) -> None:
    """After a verdict that failed: rank 0 writes the report when asked, with the error whole
    (every problem of every rank; the terminal shows the first 20 of a list)."""
    if not opts.report or ctx.rank != 0:
        return
    ep = opts.ep
    report = LoadReport(
        str(opts.checkpoint),
        opts.kind,
        opts.tp or max(1, ctx.world // ep // opts.replicas),
        ep,
        opts.verify,
        str(ctx.device),
        ranks,
        ctx.rank,
        notes=list(notes),
    )
    try:
        report.write(opts.report, error=error)
    except OSError as e:
        rank_log(ctx.rank).warning(
            "could not write the report %s: %s", escape_name(opts.report), e.strerror
        )


def served(
    opts: LoadOptions,
    ctx: DistContext,
    plan: RankPlan,
    result: LoadResult,
    deferred: tuple[DeferredTensor, ...],
    ranks: list[RankFigures],
    notes: list[str],
    verdict: Verdict,
    planner: Planner | None = None,
) -> RankShards:
    """After a verdict that passed: the report (written by rank 0 when asked), and this rank's
    shards. The attestation, when asked, is the door's to write after this (api.py)."""
    prefix = planner.prefix if planner is not None else None
    census = planner.census if planner is not None else None
    report = LoadReport(
        str(opts.checkpoint),
        opts.kind,
        plan.layout.tp,
        plan.layout.ep,
        opts.verify,
        str(ctx.device),
        ranks,
        ctx.rank,
        predictions_trusted=opts.verify == Verify.DIGEST,
        trust=verdict.trust,
        evict_page_cache=opts.evict_page_cache,
        notes=[*notes, *(planner.notes() if planner is not None else ())],
        weight_prefix=prefix.found if prefix is not None else None,
        kv_scales=census.to_dict() if census else {},
    )
    if opts.verify == Verify.OFF:
        rank_log(ctx.rank).warning(
            "verification is OFF: %d tensors served without any check against a manifest, hub blob "
            "names, etags or a signature",
            ranks[ctx.rank].tensors,
        )
    if opts.report and ctx.rank == 0:
        try:
            report.write(opts.report)
        except OSError as e:
            rank_log(ctx.rank).warning(
                "could not write the report %s: %s", escape_name(opts.report), e.strerror
            )
    return RankShards(result, plan, report, verdict, deferred)

"""The gate's refresh strategy: a trainer's push into a running engine (refresh/), vouched for by
the version manifest the trainer sent first, and the refresh's verdict in its one-line form.

An engine rank's staging is a pre-partitioned rank file held in memory (refresh/staged.py): each
window a whole stored tensor whose sha256 is the manifest's. The loader's sequence runs over it
(loading/sequence.py's ``HeldLoad``) with :class:`Pushed` as its strategy: its anchor (the
handshake's terms) is the manifest's sha256, version and strength; at sha256 strength the hash taps
check every window this rank reads against the manifest's sha256; :meth:`Pushed.settle` checks
each window's fingerprint as the loop took it and this rank's digest against the manifest's; and
:func:`judge` reaches the round's verdict from the exchanged rows, which carry the sha256 and
version of the manifest each rank verified (rows that differ refuse the round, naming both).

The manifest's facts come in as data-floor values (model/pushed.py): nothing here imports refresh/.
It is not part of gate.py's closure (the gate picks a checkpoint's strategy; a refresh names its
own), so the gate's kernel stays as small as it was."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..model.errors import LoadError
from ..model.modes import RankStatus
from ..model.pushed import PushedVersion, TensorEntry, WindowEntry
from ..model.text import escape_name, one_line
from ..model.trust import TrustKind, TrustSource
from ..model.values import Box, Triple
from .gate import Verdict
from .gate import judge as judge_load
from .hashes import FileHashed
from .node import HashPlan
from .store import Stamp
from .strategy import Findings, Job, Outcome, Prepared, RankRow, Strategy

UNCHANGED = "; the served version is unchanged"
"""How every refusal line ends (docs/refresh.md, "Failures")."""
SHA256 = "sha256"
"""The strength at which the hash taps check every window (the other: ``fingerprint``)."""


class Pushed(Strategy):
    """A round's windows, vouched for by its version manifest (see the module doc)."""

    locators_vouched_by = "the version manifest's sha256 of the window"

    def __init__(self, job: Job, pushed: PushedVersion) -> None:
        super().__init__(job)
        self.pushed = pushed
        self.vouched_by = (
            f"version {pushed.version}'s manifest (sha256 {pushed.sha256[:16]}..., "
            f"{pushed.check} strength)"
        )

    def anchor(self) -> str:
        """The handshake's terms: every engine rank must verify the same manifest, of the same
        version, at the same strength."""
        p = self.pushed
        return f"refresh version {p.version}, manifest sha256 {p.sha256}, check {p.check}"

    def trust(self) -> TrustSource:
        return TrustSource(TrustKind.MANIFEST, "the refresh's version manifest", self.pushed.sha256)

    def _prepare(self, reads: Mapping[int, Mapping[str, Box]]) -> Prepared:
        # the staging is this rank's alone (per rank): at sha256 strength it hashes every window
        # it reads, against the manifest's sha256 (the staging's Stored.sha256); else none
        mine = reads.get(self.job.me, {}) if self.pushed.check == SHA256 else {}
        return Prepared(HashPlan(self.job.me, frozenset(mine)))

    def settle(self, outcome: Outcome, files: Sequence[FileHashed] = ()) -> Findings:
        """Each window as the loop fingerprinted it when it landed, then this rank's digest,
        against the manifest's (the first problem raised, in the documented form)."""
        found = super().settle(outcome, files)
        for w in self.pushed.windows:
            seen = outcome.windows.get(w.name)
            problem = window_problem(w, seen[1]) if seen is not None else ""
            if problem:
                raise LoadError(problem)
        want = self.pushed.digest
        if found.digest != want:
            raise LoadError(
                f"the staged windows give digest {found.digest[:16]}..., the manifest says "
                f"{want[:16]}... (a window changed on the wire, or the trainer's fingerprints are "
                "not of what it sent)"
            )
        return found


def window_problem(w: WindowEntry, got: Triple) -> str:
    """Whether a window's bytes, fingerprinted as ``got``, are the ones the trainer fingerprinted
    ("": they are; else the line saying so). :meth:`Pushed.settle` asks it of every window the
    loop read; the receiver asks it of each deferred tensor (no loop reads one) as it lands."""
    if tuple(got) == tuple(w.fingerprint):
        return ""
    return (
        f"tensor {escape_name(w.name)} (from trainer rank {w.trainer}): its window arrived with "
        f"fingerprint {list(got)}, the manifest says {list(w.fingerprint)} (corrupted or lost in "
        "transport)"
    )


def table_problems(
    served: Sequence[TensorEntry] | None,
    sent: Sequence[TensorEntry],
    skipped: frozenset[str] = frozenset(),
) -> list[str]:
    """What makes a version's table not the served model's: a tensor missing (one the config
    skips may be), added, or of another dtype or shape (a missing tensor would otherwise serve
    uninitialised memory). ``served``: None takes any table (the first version sets it)."""
    if served is None or tuple(served) == tuple(sent):
        return []
    have = {t.name: t for t in served if t.name not in skipped}
    got = {t.name: t for t in sent}
    missing = [n for n in have if n not in got]
    extra = [n for n in got if n not in have and n not in skipped]
    changed = [n for n in have if n in got and have[n] != got[n]]
    if not (missing or extra or changed):
        return []
    parts = []
    if missing:
        parts.append(f"missing {', '.join(map(escape_name, missing[:5]))}")
    if extra:
        parts.append(f"not served here {', '.join(map(escape_name, extra[:5]))}")
    for n in changed[:3]:
        parts.append(
            f"{escape_name(n)} is {got[n].dtype} {list(got[n].shape)}, served as "
            f"{have[n].dtype} {list(have[n].shape)}"
        )
    return [f"the version's tensors are not the served model's: {'; '.join(parts)}"]


def refused(text: str) -> str:
    """A refusal in the documented form (``text`` names the rank and version where one is)."""
    return f"refresh refused: {text}{UNCHANGED}"


def lost(who: str, e: LoadError) -> str:
    """The line each surviving engine rank raises when the vote itself was lost (a rank died or
    hung in the handshake or the exchange): its own, naming what the collective said."""
    return refused(f"{who}: the engine ranks' vote failed ({one_line(e)})")


def judge(ranks: Sequence[RankRow], chosen: Strategy | None) -> Verdict:
    """The round's verdict from the exchanged rows alone, one line, the same on every rank: ranks
    that verified different manifests first (naming both), then the lowest failing rank's own
    line (and which others failed), then the gate's verdict of the table (gate.judge)."""
    took = [r for r in ranks if r.pushed_version]
    first = took[0] if took else None
    other = next(
        (
            r
            for r in took
            if first is not None
            and (r.pushed_sha256, r.pushed_version) != (first.pushed_sha256, first.pushed_version)
        ),
        None,
    )
    if first is not None and other is not None:
        said = [
            f"engine rank {r.rank} version {r.pushed_version} sha256 {r.pushed_sha256[:16]}..."
            for r in (first, other)
        ]
        return Verdict(
            (refused(f"the engine ranks verified different manifests: {', '.join(said)}"),), ""
        )
    # the ranks that failed (not those that only stood down because one did)
    bad = [r for r in ranks if r.failed == RankStatus.FAILED] or [r for r in ranks if r.failed]
    if bad:
        text = escape_name(bad[0].message)
        if len(bad) > 1:
            text += f" (engine ranks {', '.join(str(r.rank) for r in bad[1:])} failed too)"
        return Verdict((refused(text),), "", reporter=bad[0].rank)
    verdict = judge_load(ranks, chosen)
    if verdict.passed:
        return verdict
    lines = "\n".join(verdict.problems).splitlines()
    text = "; ".join(escape_name(line.removeprefix("load failed: ")) for line in lines)
    return Verdict((refused(text),), "")


def no_stamp() -> Stamp:
    """A held staging has no files to stamp (no stored prediction can vouch for a push)."""
    raise LoadError("a refresh's staging has no stamp (no stored prediction vouches for it)")

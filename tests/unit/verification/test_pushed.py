"""The gate's refresh verdict (verification/pushed.py) from exchanged rows alone: the manifest each
engine rank verified rides in its row (model/figures.py), rows that differ refuse the round naming
both, the lowest failing rank's own line stands (ranks that only stood down are not counted), and
every line keeps docs/refresh.md's form; a rank that fails before the handshake meets it and the
exchange with its own line (loading/sequence.py's HeldLoad, one rank, no rendezvous store)."""

from __future__ import annotations

from dataclasses import replace

from tpload.distributed.exchange import Arrivals
from tpload.loading.sequence import HeldLoad
from tpload.model.figures import RankFigures
from tpload.model.modes import RankStatus
from tpload.model.pushed import TensorEntry, WindowEntry
from tpload.model.values import AGREED_BYTES
from tpload.verification import pushed

SHA_A, SHA_B = "ab" * 32, "cd" * 32


def _row(rank: int, *, version: int = 2, sha: str = SHA_A, **kw: object) -> RankFigures:
    kw.setdefault("agreed", "0" * AGREED_BYTES)  # it passed the handshake
    return RankFigures(rank=rank, seq=1, pushed_version=version, pushed_sha256=sha, **kw)  # type: ignore[arg-type]


def test_a_row_carries_the_manifest_its_rank_verified_through_the_exchange() -> None:
    back = RankFigures.from_row(_row(1, version=7, sha=SHA_B).to_row())
    assert (back.pushed_version, back.pushed_sha256) == (7, SHA_B)
    assert RankFigures.from_row(RankFigures().to_row()).pushed_sha256 == ""  # a load: none


def test_rows_that_verified_different_manifests_refuse_the_round_naming_both() -> None:
    # every rank failed at the handshake (its terms differ): the cause is named, not the symptom
    failed = {"failed": RankStatus.FAILED, "message": "engine rank 0, version 2: the ranks differ"}
    rows = [_row(0, **failed), _row(1, version=3, sha=SHA_B, **failed), _row(2)]
    verdict = pushed.judge(rows, None)
    assert verdict.problems == (
        "refresh refused: the engine ranks verified different manifests: engine rank 0 version 2 "
        f"sha256 {SHA_A[:16]}..., engine rank 1 version 3 sha256 {SHA_B[:16]}...; the served "
        "version is unchanged",
    )
    # a rank that took no manifest (it failed before one arrived) differs from nobody
    lost = _row(1, version=0, sha="", failed=RankStatus.FAILED, message="engine rank 1: gone")
    (line,) = pushed.judge([_row(0), lost], None).problems
    assert line == "refresh refused: engine rank 1: gone; the served version is unchanged"


def test_the_lowest_failing_rank_s_line_stands_and_ranks_that_stood_down_are_not_counted() -> None:
    down = {"failed": RankStatus.STOOD_DOWN, "message": "engine rank 0, version 2: stopped"}
    rows = [
        _row(0, **down),
        _row(1, failed=RankStatus.FAILED, message="engine rank 1, version 2: over\nthe budget"),
        _row(2, failed=RankStatus.FAILED, message="engine rank 2, version 2: lost"),
    ]
    verdict = pushed.judge(rows, None)
    assert verdict.problems == (
        "refresh refused: engine rank 1, version 2: over\\x0athe budget (engine ranks 2 failed "
        "too); the served version is unchanged",
    )  # untrusted text escaped: one line
    assert verdict.reporter == 1


def test_a_table_that_passed_every_rank_yet_disagrees_is_refused_in_one_line() -> None:
    rows = [_row(0), _row(1, agreed="1" * AGREED_BYTES)]
    (line,) = pushed.judge(rows, None).problems
    assert line.startswith("refresh refused: ") and "\n" not in line
    assert line.endswith("; the served version is unchanged")


def test_a_version_s_table_is_checked_against_the_served_model_by_the_gate() -> None:
    served = (TensorEntry("a", "BF16", (2, 2)), TensorEntry("b", "F32", (2,)))
    assert pushed.table_problems(served, served) == []
    assert pushed.table_problems(None, served[:1]) == []  # no served table yet: the first sets it
    (line,) = pushed.table_problems(served, (served[0], TensorEntry("c", "F32", (1,))))
    assert line == "the version's tensors are not the served model's: missing b; not served here c"


def test_a_rank_that_failed_before_the_handshake_meets_it_and_the_exchange_with_its_line() -> None:
    load = HeldLoad(0, 1, None, who="engine rank 0, version 2", timeout_s=5, judge=pushed.judge)
    said = "engine rank 0, version 2: its windows for this rank are over the staging budget"
    assert not load.begin(None, failed=said, pushed=(SHA_A, 2))
    load.run()  # nothing to run: it never passed the handshake
    verdict = load.end()
    assert verdict.problems == (f"refresh refused: {said}; the served version is unchanged",)
    assert load.result is None
    assert (load.fig.pushed_version, load.fig.pushed_sha256) == (2, SHA_A)
    assert Arrivals(load.ctx, load.seq).tidy  # the engine's store keeps no mark of a round


def test_a_held_load_leaves_no_mark_in_a_default_store_that_exists(monkeypatch) -> None:  # noqa: ANN001
    """Its collectives still mark who arrived (a rank lost before one is named), and each rank
    removes its mark once the collective completed: a round a step leaves no key in the engine's
    store. A load's marks stay (torchrun's store is the load's)."""
    import tpload.distributed.exchange as exchange

    keys: set[str] = set()

    class Store:
        def set(self, key: str, value: str) -> None:
            keys.add(key)

        def delete_key(self, key: str) -> bool:
            keys.discard(key)
            return True

        def check(self, wanted: list[str]) -> bool:
            return all(k in keys for k in wanted)

    monkeypatch.setattr(exchange, "_store", Store)
    load = HeldLoad(0, 2, None, who="engine rank 0", timeout_s=5, judge=pushed.judge)
    held = Arrivals(load.ctx, load.seq)
    held.arrive()
    assert held.missing() == [1]  # rank 1 never came: named
    held.leave()
    assert keys == set()
    kept = Arrivals(replace(load.ctx, store=True), load.seq)
    kept.arrive()
    kept.leave()
    assert len(keys) == 1  # a load's collectives keep their marks


def test_a_window_is_judged_against_the_manifest_s_fingerprint_by_one_rule() -> None:
    w = WindowEntry("model.x\n", (2, 4), ((0, 2), (0, 4)), 1, (1, 2, 3))
    assert pushed.window_problem(w, (1, 2, 3)) == ""
    assert pushed.window_problem(w, (1, 2, 4)) == (
        "tensor model.x\\x0a (from trainer rank 1): its window arrived with fingerprint [1, 2, 4], "
        "the manifest says [1, 2, 3] (corrupted or lost in transport)"
    )

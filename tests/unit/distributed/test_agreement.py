"""What every rank must agree on before its copy loop (tpload/distributed/agreement.py, with
verification/terms.py): the handshake's row and decision, the wording of a difference, and the
verdict's second look at the exchanged rows. The collective itself runs in
tests/integration/test_agreement.py (real torchrun launches)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tpload
from tpload.distributed import versions
from tpload.distributed.agreement import (
    WORDS,
    Handshake,
    decide,
    differences,
    foreign,
    outcome,
    row,
)
from tpload.distributed.placement import Placement
from tpload.distributed.world import DistContext
from tpload.model.errors import CheckpointError, LoadError, StoodDown
from tpload.model.figures import RankFigures
from tpload.model.modes import RankStatus
from tpload.model.values import AGREED_BYTES
from tpload.options.load_options import LoadOptions
from tpload.planning.layout import Layout
from tpload.selection.config import load_config, with_rules
from tpload.verification.gate import judge
from tpload.verification.strategy import digest_map
from tpload.verification.terms import FIELDS, PLAN_FIELDS, Terms, disagreement

SHA_A, SHA_B = "a" * 64, "b" * 64


NO_FILES = dict.fromkeys(PLAN_FIELDS, "")


def terms(
    anchor: str = f"manifest sha256 {SHA_A}",
    placement: object = None,
    files: dict[str, str] | None = None,
    **options,
) -> Terms:
    opts = LoadOptions(checkpoint="/ckpt", **options)
    config = with_rules(
        load_config(), skip=opts.skip, defer=opts.defer, skip_activation_scales=False
    )
    plan_files = {**NO_FILES, **(files or {})}
    return Terms.of(opts, Layout(opts.tp or 2, opts.ep), config, anchor, placement, plan_files)


def table(*per_rank: Terms | None, seq: int = 1, failed: tuple[int, ...] = ()) -> torch.Tensor:
    return torch.stack(
        [
            row(seq, RankStatus.FAILED if r in failed else RankStatus.OK, t)
            for r, t in enumerate(per_rank)
        ]
    )


def test_ranks_that_agree_pass_and_a_different_anchor_is_named_with_both_values() -> None:
    a, b = terms(), terms(anchor=f"manifest sha256 {SHA_B}")
    decide(table(a, a, a, a))  # no difference: returns
    with pytest.raises(Exception) as e:
        decide(table(a, a, b, b))
    assert not isinstance(e.value, StoodDown)  # a difference is every rank's failure
    msg = str(e.value)
    assert msg.startswith(
        "the ranks do not load the same thing the same way: they differ in the trust anchor ("
    )
    assert f"rank 0, 1: 'manifest sha256 {SHA_A[:45]}...'" in msg
    assert f"rank 2, 3: 'manifest sha256 {SHA_B[:45]}...'" in msg
    assert "--manifest-sha256" in msg and ", and in" not in msg


def test_the_first_difference_in_field_order_is_named_and_the_others_listed() -> None:
    node, off = terms(), terms(verify="off", anchor=f"manifest sha256 {SHA_B}")
    msg = differences(table(node, node, off, off))
    assert "they differ in the verify mode (rank 0, 1: 'node'; rank 2, 3: 'off')" in msg
    assert "'off'), and in the trust anchor; give every rank the same --verify" in msg
    # every option that shapes the served bytes is compared, each by its own name
    for option, label in [
        ({"kind": "expanded"}, "the kind"),
        ({"tp": 4}, "tp"),
        ({"ep": 2}, "ep"),
        ({"skip": ("mtp.*",)}, "the skip globs"),
        ({"defer": ("head.weight",)}, "the defer globs"),
        ({"skip_activation_scales": True}, "skip_activation_scales"),
    ]:
        msg = differences(table(node, terms(**option)))
        assert msg and msg.split(": ", 1)[1].startswith(f"they differ in {label} ("), (option, msg)


def test_a_file_that_shapes_the_plan_is_compared_pinned_or_not_and_named_with_short_hex() -> None:
    # node B's config.json with other head counts: the same config id, windows cut another way
    mine, theirs = {"config.json": SHA_A}, {"config.json": SHA_B}
    same_config = terms(files=mine)
    decide(table(same_config, terms(files=mine)))
    msg = differences(table(same_config, same_config, terms(files=theirs), terms(files=theirs)))
    assert msg.startswith(
        "the ranks do not load the same thing the same way: they differ in config.json "
        f"(rank 0, 1: 'sha256 {SHA_A[:16]}'; rank 2, 3: 'sha256 {SHA_B[:16]}'); every node must "
        "hold the same config.json"
    ), msg
    # before the config and the anchor, which a changed config.json may change as well
    both = terms(files=theirs, anchor=f"manifest sha256 {SHA_B}")
    assert ", and in the trust anchor;" in differences(table(same_config, both))
    # a file one rank lacks, each file by its own name, and a GGUF set's key-values
    absent = differences(table(terms(files={"hf_quant_config.json": SHA_A}), terms()))
    assert f"hf_quant_config.json (rank 0: 'sha256 {SHA_A[:16]}'; rank 1: 'absent')" in absent
    index = differences(table(terms(files={"model.safetensors.index.json": SHA_A}), terms()))
    assert "they differ in model.safetensors.index.json (" in index
    kv = differences(table(terms(files={"gguf_kv": SHA_A}), terms(files={"gguf_kv": SHA_B})))
    assert "they differ in the GGUF key-values (" in kv and "same GGUF header" in kv


def test_the_row_leads_with_a_header_checked_before_the_row_is_used() -> None:
    a = terms()
    r = row(1, RankStatus.OK, a)
    assert (
        r[:3].tolist()
        == [versions.MAGIC, versions.FORMAT, WORDS]
        == [
            int.from_bytes(b"tpldhand", "little", signed=True),
            3,
            r.numel(),
        ]
    )
    assert foreign(table(a, a), 0) is None
    # a row of another format (or from a tpload before the header) is named, not read as terms
    other = row(1, RankStatus.OK, a)
    other[1] = 4
    old = torch.zeros(WORDS, dtype=torch.int64)
    old[:2] = torch.tensor([1, 0])  # the old layout: the call, the status, no header
    e = foreign(torch.stack([row(1, RankStatus.OK, a), other, old]), 0)
    assert isinstance(e, versions.Incompatible)
    assert str(e).startswith(
        f"rank 0: the handshake rows of rank 1, 2 are not this tpload's (magic "
        f"{versions.MAGIC:#018x}, format 3, length {WORDS}; rank 1: magic {versions.MAGIC:#018x}, "
        f"format 4, length {WORDS}; rank 2: magic 0x0000000000000001, format 0, length 0)"
    ), e
    assert "every rank must run the same tpload (tpload " in str(e)


def test_ranks_of_another_tpload_or_none_named_are_named_and_meet_no_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = versions.stamp()
    assert mine == f"tpload {tpload.__version__}, handshake row format 3"
    assert versions.mismatch(1, [mine, mine]) is None
    e = versions.mismatch(0, [mine, mine, "tpload 9.9, handshake row format 3", None])
    assert isinstance(e, versions.Incompatible) and str(e) == (
        f"rank 0: the ranks run different tploads (rank 0, 1: '{mine}'; rank 2: 'tpload 9.9, "
        "handshake row format 3'; rank 3: no version (a tpload older than this one)); every rank "
        "must run the same tpload: install one version on every node (`python -m tpload "
        "--version` on each)"
    )
    monkeypatch.setattr(tpload, "__version__", "9.9")  # read at each call
    assert versions.stamp() == "tpload 9.9, handshake row format 3"
    # a rank that found one meets neither the handshake nor the exchange, and raises the cause
    meeting = Handshake(1, 5.0)
    meeting.cannot_meet(e)
    meeting.unmet(RankFigures(seq=1, failed=RankStatus.FAILED, message=str(e)), None)
    with pytest.raises(LoadError) as raised:
        meeting.raise_lost()
    assert str(raised.value) == str(e)


def test_values_are_escaped_cut_on_a_character_boundary_and_runs_of_ranks_shortened() -> None:
    plain, odd = terms(), terms(skip=("x\x1b[2J*",))
    msg = differences(table(odd, plain, plain, plain, plain, odd))
    assert "\x1b" not in msg and "x\\x1b[2J*" in msg
    assert "rank 0, 5: 'x\\x1b[2J*'" in msg and "rank 1-4: 'none'" in msg
    long = terms(skip=tuple(f"é{i}.*" for i in range(40)))
    shown = differences(table(plain, long)).split("rank 1: '")[1].split("'")[0]
    assert shown.endswith("...") and len(shown.encode()) <= 64 and "\ufffd" not in shown
    longer = terms(skip=tuple(f"é{i}.*" for i in range(41)))  # é40.* sorts far in
    assert "; they differ after the first 64 bytes)" in differences(table(long, longer))


def test_replicas_placed_in_rank_order_agree_with_replicas_and_other_placements_do_not() -> None:
    in_order = terms(placement=Placement.in_order(2, 2))
    same = terms(placement=Placement([[0, 2], [1, 3]]))
    other = terms(placement=Placement([[0, 1], [2, 3]]))
    assert in_order == same
    msg = differences(table(in_order, other))
    assert "they differ in the replicas" in msg and "'2, placed [[0, 1], [2, 3]]'" in msg
    assert "they differ in the replicas (rank 0: '2'; rank 1: '1')" in differences(
        table(in_order, terms())
    )


def test_a_rank_that_failed_before_it_stops_the_others_naming_it() -> None:
    a = terms()
    with pytest.raises(StoodDown, match=r"^stopped before the copy loop: rank 3 failed before it$"):
        decide(table(a, a, a, None, failed=(3,)))
    with pytest.raises(StoodDown, match="different load\\(\\) calls"):
        decide(torch.stack([row(1, RankStatus.OK, a), row(2, RankStatus.OK, a)]))


def test_one_process_meets_itself_and_carries_its_terms_into_the_exchange_row() -> None:
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None, None)
    fig, a = RankFigures(seq=1), terms()
    meeting = Handshake(1, 5.0)
    meeting.meet(fig, ctx, a)
    assert meeting.met and fig.agreed == a.hex() and len(fig.agreed) == AGREED_BYTES
    assert RankFigures.from_row(fig.to_row()).agreed == a.hex()  # it survives the wire
    meeting.raise_lost()  # nothing lost
    failed = RankFigures(seq=1, failed=RankStatus.FAILED, message="rank 0: bad")
    late = Handshake(1, 5.0)
    late.unmet(failed, ctx)  # a rank that failed before it still meets it, once
    assert late.met and failed.agreed == "" and failed.failed == RankStatus.FAILED


def test_a_failure_becomes_a_status_and_a_message() -> None:
    assert outcome(2, CheckpointError("x: bad")) == (RankStatus.FAILED, "rank 2: x: bad")
    assert outcome(2, StoodDown("rank 1 failed")) == (
        RankStatus.STOOD_DOWN,
        "rank 2: rank 1 failed",
    )
    assert outcome(0, KeyboardInterrupt())[1] == "rank 0: interrupted (Ctrl-C)"
    assert outcome(0, ValueError("\x1b")) == (
        RankStatus.FAILED,
        "rank 0: unexpected ValueError: \\x1b",
    )


def _rank(r: int, agreed: str, **kw: object) -> RankFigures:
    return RankFigures(rank=r, seq=1, agreed=agreed, **kw)


def test_the_verdict_names_the_failed_rank_and_lists_those_that_only_stopped() -> None:
    ranks = [
        _rank(0, "", failed=RankStatus.STOOD_DOWN, message="rank 0: stopped: rank 2 failed"),
        _rank(1, "", failed=RankStatus.STOOD_DOWN, message="rank 1: stopped: rank 2 failed"),
        _rank(2, "", failed=RankStatus.FAILED, message="rank 2: the pin differs"),
    ]
    verdict = judge(ranks, None)
    assert not verdict.passed and verdict.reporter == 2
    assert verdict.problems == (
        "load failed on rank 2 (1 of 3 ranks); no rank returned weights\n"
        "rank 2: the pin differs\n"
        "rank 0, 1: stopped: rank 2 failed",
    )
    # a table where every rank only says it stopped still fails (never read as a pass)
    stopped = judge(ranks[:2], None)
    assert not stopped.passed and "load failed on rank 0, 1 (2 of 2 ranks)" in stopped.problems[0]


def test_the_verdict_refuses_rows_whose_terms_differ_or_say_nothing() -> None:
    a, b = terms().hex(), terms(anchor=f"manifest sha256 {SHA_B}").hex()
    (problem,) = disagreement([_rank(0, a), _rank(1, a), _rank(2, b)])
    assert problem.startswith("the ranks' rows differ in the trust anchor (rank 0, 1: hash ")
    assert f"rank 2: hash {b[-16:]}" in problem
    assert disagreement([_rank(0, a), _rank(1, "")]) == [
        "rank 1: its row does not say what it loaded (no handshake)"
    ]
    assert disagreement([_rank(0, a), _rank(1, a)]) == []
    chosen = SimpleNamespace(verdict=lambda ranks: [], vouched_by="x", trust=lambda: None)
    verdict = judge([_rank(0, a), _rank(1, b)], chosen)
    assert not verdict.passed and "differ in the trust anchor" in verdict.problems[0]
    assert judge([_rank(0, a), _rank(1, a)], chosen).passed


def test_whole_file_anchors_are_named_by_their_digests_wherever_the_folder_sits() -> None:
    here = {Path("/n0/ckpt/a.safetensors"): "11", Path("/n0/ckpt/b.safetensors"): "22"}
    there = {Path("/n1/x/b.safetensors"): "22", Path("/n1/x/a.safetensors"): "11"}
    assert digest_map(here, Path("/n0/ckpt")) == digest_map(there, Path("/n1/x"))
    lines = "a.safetensors\0" + "11\n" + "b.safetensors\0" + "22\n"
    assert digest_map(here, Path("/n0/ckpt")) == hashlib.sha256(lines.encode()).hexdigest()
    changed = {**there, Path("/n1/x/a.safetensors"): "12"}
    assert digest_map(changed, Path("/n1/x")) != digest_map(there, Path("/n1/x"))


def test_the_row_layout_holds_a_hash_and_the_shown_bytes_of_every_field() -> None:
    r = row(3, RankStatus.OK, terms())
    assert r.dtype == torch.int64 and r.numel() == 5 + len(FIELDS) * (1 + 64 // 8)
    assert r[3:5].tolist() == [3, 0] and row(3, RankStatus.FAILED, None)[5:].abs().sum() == 0

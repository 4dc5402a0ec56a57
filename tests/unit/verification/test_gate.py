"""The gate's exit types: nothing can be made from bytes nothing vouched for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tpload.deferred import DeferredTensor
from tpload.errors import LoadError
from tpload.plan import Layout
from tpload.report import RankFigures
from tpload.shards import RankShards
from tpload.verification import gate


def _locator(tmp_path: Path, sha: str | None, vouched_by: str) -> DeferredTensor:
    f = tmp_path / "shard.bin"
    f.write_bytes(b"x" * 16)
    return DeferredTensor("t", f, 0, 16, "U8", (16,), sha, vouched_by)


def test_a_locator_needs_a_digest_and_what_vouches_for_it(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="a digest with nothing vouching for it"):
        _locator(tmp_path, "ab" * 32, "")
    with pytest.raises(LoadError, match="no digest to check it against"):
        _locator(tmp_path, None, "the manifest")
    assert _locator(tmp_path, None, "").sha256 is None  # verify off: said so, nothing claimed


def test_a_locator_checks_what_it_streams(tmp_path: Path) -> None:
    d = _locator(tmp_path, "00" * 32, "the manifest's sha256 of the tensor")
    with pytest.raises(LoadError, match="sha256"):
        list(d.chunks(4))


def test_shards_are_made_only_from_a_passing_verdict() -> None:
    with pytest.raises(LoadError, match="only from the gate's verdict"):
        RankShards(None, None, None, "passed")  # type: ignore[arg-type]
    with pytest.raises(LoadError, match="rank 1: digest differs"):
        RankShards(None, None, None, gate.Verdict(("rank 1: digest differs",), ""))  # type: ignore[arg-type]


def _job(verify: str, *, files: bool = False, manifest: bool = True) -> gate.Job:
    storage = SimpleNamespace(catalogue=SimpleNamespace(manifest_sha256="ab" * 32 if manifest else None),
                              per_rank=False, file_digests={} if files else None)
    opts = SimpleNamespace(kind="packed", digest_store="/nonexistent-store", verify=verify)
    ctx = SimpleNamespace(rank=0, group=None)
    return gate.Job(opts, ctx, RankFigures(), storage, {}, "x", Layout(1, 1), dict)


@pytest.mark.parametrize(("verify", "files", "want"), [
    ("off", False, gate.Unchecked), ("off", True, gate.Unchecked), ("digest", False, gate.Predicted),
    ("node", False, gate.TensorDigests), ("rank", False, gate.TensorDigests),
    ("node", True, gate.FileDigests), ("rank", True, gate.FileDigests)])
def test_one_strategy_per_mode_and_anchor(verify: str, files: bool, want: type) -> None:
    assert type(gate.strategy(_job(verify, files=files))) is want


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        gate.strategy(_job("sometimes"))


def test_whole_file_locators_need_a_digest_from_this_load() -> None:
    s = gate.strategy(_job("node", files=True))
    s.derived = {"a": "cd" * 32}
    assert s.locators(("a",)) == {"a": "cd" * 32}
    with pytest.raises(LoadError, match="were not hashed in this load"):
        s.locators(("a", "b"))


def test_the_verdict_names_what_vouched() -> None:
    s = gate.strategy(_job("node"))
    v = gate.judge([RankFigures(rank=0, seq=1)], s)
    assert v.passed and v.vouched_by == "the manifest's per-tensor digests"
    v = gate.judge([RankFigures(rank=0, seq=1, failed=1, message="rank 0: boom")], s)
    assert not v.passed and "boom" in v.problems[0]

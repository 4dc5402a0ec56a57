"""The gate's exit types: nothing can be made from bytes nothing vouched for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tpload.loading.deferred import DeferredTensor
from tpload.loading.shards import RankShards
from tpload.model.errors import LoadError
from tpload.model.figures import RankFigures
from tpload.model.trust import TrustKind, TrustSource
from tpload.model.values import AGREED_BYTES
from tpload.planning.layout import Layout
from tpload.verification import gate, strategy, whole_files
from tpload.verification.terms import FIELDS


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


def _job(verify: str, *, files: bool = False, manifest: bool = True) -> strategy.Job:
    storage = SimpleNamespace(
        catalogue=SimpleNamespace(
            manifest_sha256="ab" * 32 if manifest else None, manifest_path="/c/NATIVE_MANIFEST.json"
        ),
        per_rank=False,
        file_digests={} if files else None,
        file_source=None,
        anchor_files=None,
        root=Path("/nonexistent-checkpoint"),
    )
    opts = SimpleNamespace(
        kind="packed", digest_store="/nonexistent-store", verify=verify, checkpoint=None
    )
    ctx = SimpleNamespace(rank=0, world=1, node_peers=[0], node_lists=[[0]])
    return strategy.Job(opts, ctx, storage, {}, "x", Layout(1, 1), dict)


@pytest.mark.parametrize(
    ("verify", "files", "want"),
    [
        ("off", False, gate.Unchecked),
        ("off", True, gate.Unchecked),
        ("digest", False, gate.Predicted),
        ("node", False, gate.TensorDigests),
        ("rank", False, gate.TensorDigests),
        ("node", True, whole_files.FileDigests),
        ("rank", True, whole_files.FileDigests),
    ],
)
def test_one_strategy_per_mode_and_anchor(verify: str, files: bool, want: type) -> None:
    assert type(gate.strategy(_job(verify, files=files))) is want


def test_each_strategy_names_its_anchor_the_same_whatever_the_mode() -> None:
    """The handshake compares anchors (distributed/agreement.py): a manifest's sha256 whatever the
    mode (so --verify off on one node is named as the verify mode, not as another anchor), else the
    folder's whole-file digests, each file by its name inside the folder."""
    sha = "ab" * 32
    for verify in ("node", "rank", "digest", "off"):
        assert gate.strategy(_job(verify)).anchor() == f"manifest sha256 {sha}"
    assert gate.strategy(_job("off", manifest=False)).anchor() == (
        "none (no manifest, no file digests)"
    )
    job = _job("node", files=True, manifest=False)
    job.checkpoint.root = Path("/n0/snap")
    job.checkpoint.file_digests = {Path("/n0/snap/a.safetensors"): "11"}
    named = gate.strategy(job).anchor()
    assert named == "file digests " + strategy.digest_map({"a.safetensors": "11"})
    job.checkpoint.file_digests = {Path("/n0/snap/a.safetensors"): "12"}
    assert gate.strategy(job).anchor() != named
    # the files that shape the plan are covered too, by their blob names or etags
    job.checkpoint.file_digests = {Path("/n0/snap/a.safetensors"): "11"}
    job.checkpoint.anchor_files = {Path("/n0/snap/config.json"): "git-sha1:22"}
    assert gate.strategy(job).anchor() == "file digests " + strategy.digest_map(
        {"a.safetensors": "11", "config.json": "git-sha1:22"}
    )


def test_a_signed_folder_s_anchor_is_what_its_bundle_signs_wherever_the_folder_sits() -> None:
    def bundle(folder: str, a: str = "11") -> SimpleNamespace:
        pieces = {"b": {(4, 8): "33", (0, 4): "22"}}
        path = Path(folder) / "model.sig"
        return SimpleNamespace(
            whole={"a": ("sha256", a)},
            pieces=pieces,
            bundle=path,
            what="k",
            bundle_sha256="cd" * 32,
            signer_id="k1",
        )

    here, there = bundle("/n0/x"), bundle("/n1/y")
    files = whole_files.SignedFiles(_job("node", manifest=False), here)
    assert files.anchor() == f"signed digests {whole_files.statement(there)}"
    assert files.signature() == f"bundle sha256 {'cd' * 32}, signer k1"  # by content, not name
    assert whole_files.statement(bundle("/n1/y", a="12")) != whole_files.statement(here)
    signed = gate.SignedManifest(_job("node"), here)
    assert signed.anchor() == f"manifest sha256 {'ab' * 32}"  # the signature: its own term
    assert signed.signature() == f"bundle sha256 {'cd' * 32}, signer k1"
    assert gate.strategy(_job("node")).signature() == "none"


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        gate.strategy(_job("sometimes"))


def test_whole_file_locators_need_a_digest_from_this_load() -> None:
    s = gate.strategy(_job("node", files=True))
    s.derived = {"a": "cd" * 32}
    assert s.locators(("a",)) == {"a": "cd" * 32}
    with pytest.raises(LoadError, match="were not hashed in this load"):
        s.locators(("a", "b"))


def test_the_row_has_room_for_a_hash_of_every_term() -> None:
    """model/values.py's AGREED_BYTES is the row's width (the report's side); terms.py's FIELDS
    are what the handshake hashes (the gate's side): 16 hex digits each."""
    assert 16 * len(FIELDS) == AGREED_BYTES


def test_the_verdict_names_what_vouched() -> None:
    s = gate.strategy(_job("node"))
    agreed = "0f" * (
        AGREED_BYTES // 2
    )  # what the handshake put in the row (distributed/agreement.py)
    v = gate.judge([RankFigures(rank=0, seq=1, agreed=agreed)], s)
    assert v.passed and v.vouched_by == "the manifest's per-tensor digests"
    assert v.trust == TrustSource(TrustKind.MANIFEST, "/c/NATIVE_MANIFEST.json", "ab" * 32)
    assert v.trust.words("/c") == f"NATIVE_MANIFEST.json (sha256 {'ab' * 8}...)"
    off = gate.judge([RankFigures(rank=0, seq=1, agreed=agreed)], gate.strategy(_job("off")))
    assert off.trust.kind == TrustKind.NONE and off.trust.words() == "nothing (--verify off)"
    v = gate.judge([RankFigures(rank=0, seq=1)], s)  # a row that never said what it loaded
    assert not v.passed and "its row does not say what it loaded" in v.problems[0]
    v = gate.judge([RankFigures(rank=0, seq=1, failed=1, message="rank 0: boom")], s)
    assert not v.passed and "boom" in v.problems[0]


def test_offline_writers_take_only_what_the_gate_checked(tmp_path: Path) -> None:
    import numpy as np

    from tpload.sources.hashing import at_rest
    from tpload.storage.hub import to_hub_cache
    from tpload.storage.sharded import ShardedStorage
    from tpload.tools.published import write_published
    from tpload.verification.store import DigestStore, write_sidecar
    from tpload.verification.vouched import Vouched

    with pytest.raises(LoadError, match="only by the gate"):
        Vouched(("a",), np.zeros((1, 32), np.uint8))
    with pytest.raises(LoadError, match="only from tensors the gate checked"):
        write_sidecar(DigestStore(tmp_path / "store"), "ab" * 32, tmp_path, {"a": "cd" * 32}, {})  # type: ignore[arg-type]
    # a hub snapshot has no per-tensor digests: the gate vouches for none of its tensors at rest
    snap = to_hub_cache(
        write_published(tmp_path / "p", "gpt-oss-tiny", manifest=False), tmp_path / "hub", "o/m"
    )
    storage = ShardedStorage(snap)
    try:
        names = storage.catalogue.names()[:2]
        with pytest.raises(
            LoadError,
            match=r"nothing exported: .* has no NATIVE_MANIFEST\.json, and this checks each tensor "
            r"against the manifest's sha256 \(a hub snapshot's blob names",
        ):  # said once, up front: no manifest is named as if it were there
            at_rest(storage, names, threads=0, what="nothing exported")
    finally:
        storage.close()
    storage = ShardedStorage(write_published(tmp_path / "m", "gpt-oss-tiny"))
    try:
        names = storage.catalogue.names()[:3]
        checked = at_rest(storage, names, threads=0)
        assert checked.names == tuple(names) and checked.sha256.shape == (3, 32)
        assert checked.hexes("sha256") == {n: storage.stored(n).sha256 for n in names}
        # the gate vouches only for what the producer it is handed hashed: a tensor left out is a
        # problem, named, never a digest nobody took

        def short(asked: object, digests: object) -> object:
            from tpload.sources.hashing import hash_whole

            return hash_whole(storage, names[:2])

        with pytest.raises(LoadError, match=rf"tensor {names[2]}: not hashed"):
            gate.at_rest(storage, names, hash_whole=short)
    finally:
        storage.close()

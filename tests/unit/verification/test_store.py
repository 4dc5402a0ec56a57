"""The blake3 sidecar: written only after every sha256 matched, kept in the operator's store, used
by a load only while fresh and complete (else sha256, with a note saying why), and optional."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tpload
from tpload.cli import main
from tpload.model.errors import LoadError
from tpload.storage.sharded import ShardedStorage
from tpload.tools.offline import write_blake3
from tpload.verification import hashes
from tpload.verification.store import DigestStore, content_hash, read_sidecar, sidecar_path

from ...helpers import edit_json, poke, shard_of

pytest.importorskip("blake3")


def _choice(root: Path, store: Path) -> tuple[hashes.Digests, str]:
    from tpload.verification.store import checkpoint_stamp

    storage = ShardedStorage(root)
    try:
        return content_hash(
            DigestStore(store),
            storage.catalogue,
            lambda: checkpoint_stamp(storage),
            threads=1,
            fix="FIX",
        )
    finally:
        storage.close()


def _load(root: Path, store: Path, **kw: object) -> tpload.RankShards:
    return tpload.load(root, digest_store=str(store), progress=False, **kw)


def test_the_sidecar_holds_every_tensor_in_the_operators_store_and_leaves_the_checkpoint_alone(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    import blake3

    store = tmp_path / "store"
    before = {p.name: p.read_bytes() for p in ckpt_copy.iterdir()}
    path = write_blake3(ckpt_copy, store=store)
    assert {
        p.name: p.read_bytes() for p in ckpt_copy.iterdir()
    } == before  # manifest bytes (and pins) unchanged
    assert (
        oct(path.stat().st_mode & 0o777) == "0o600" and oct(store.stat().st_mode & 0o777) == "0o700"
    )
    storage = ShardedStorage(ckpt_copy)
    sha, names = storage.catalogue.manifest_sha256, storage.catalogue.names()
    storage.close()
    assert path == sidecar_path(DigestStore(store), sha)
    side = read_sidecar(DigestStore(store), sha)
    assert sorted(side.tensors) == sorted(names) and side.stamp["manifest_sha256"] == sha
    name = "head.weight"  # an independent blake3 of the tensor's stored bytes
    from ...ckpt_tools import stored_bytes

    assert side.tensors[name] == blake3.blake3(stored_bytes(ckpt_copy, name)).hexdigest()
    digests, why = _choice(ckpt_copy, store)
    assert digests.hash == "blake3" and why == "" and digests.source == str(path)


def test_a_stale_or_incomplete_sidecar_falls_back_to_sha256_saying_why(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    path = write_blake3(ckpt_copy, store=store)
    shard = ckpt_copy / shard_of(ckpt_copy, "head.weight")
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    digests, why = _choice(ckpt_copy, store)
    assert (
        digests.hash == "sha256"
        and f"shard {shard.name} changed (size or mtime)" in why
        and "FIX" in why
    )
    report = _load(ckpt_copy, store).report  # the load itself: sha256, and the note in the report
    assert report.hash == "sha256" and report.to_dict()["hash"] == "sha256"
    assert any("not used, tensors checked by sha256" in n and shard.name in n for n in report.notes)
    assert "by sha256" in report.table()
    write_blake3(ckpt_copy, store=store)  # rewritten: fresh again
    edit_json(path, lambda d: d["tensors"].pop("head.weight"))
    os.chmod(path, 0o600)
    digests, why = _choice(ckpt_copy, store)
    assert (
        digests.hash == "sha256" and "lacks 1 of the manifest's tensors (first head.weight)" in why
    )


def test_a_fresh_sidecar_makes_the_load_hash_blake3_with_the_same_digest(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    plain = _load(ckpt_copy, store, verify="rank").report
    write_blake3(ckpt_copy, store=store)
    fast = _load(ckpt_copy, store, verify="rank").report
    assert (plain.hash, fast.hash) == ("sha256", "blake3") and fast.mine.blake3 == 1
    assert fast.mine.digest == plain.mine.digest and fast.mine.hashed == plain.mine.hashed > 0
    assert "tensors by blake3" in fast.table()
    off = _load(ckpt_copy, store, verify="off").report  # a mode that hashes nothing names no hash
    assert off.hash is None and off.mine.blake3 == 0


def test_a_sidecar_that_others_can_write_is_refused(ckpt_copy: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    path = write_blake3(ckpt_copy, store=store)
    os.chmod(path, 0o620)
    with pytest.raises(LoadError, match="writable by others"):
        _choice(ckpt_copy, store)
    os.chmod(path, 0o600)
    path.write_text(
        json.dumps(
            {"manifest_sha256": json.loads(path.read_text())["manifest_sha256"], "hash": "md5"}
        )
    )
    with pytest.raises(LoadError, match="not a blake3 sidecar"):
        _choice(ckpt_copy, store)


def test_without_the_blake3_package_loads_use_sha256_and_the_command_says_how_to_get_it(
    ckpt_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    store = tmp_path / "store"
    write_blake3(ckpt_copy, store=store)
    monkeypatch.setattr(hashes, "_blake3", None)
    digests, why = _choice(ckpt_copy, store)
    assert digests.hash == "sha256" and "not installed (pip install blake3" in why
    with pytest.raises(LoadError, match=r"pip install blake3"):
        write_blake3(ckpt_copy, store=store)
    assert (
        main(
            [
                "manifest",
                str(ckpt_copy),
                "--hash",
                "blake3",
                "--digest-store",
                str(tmp_path / "other"),
            ]
        )
        == 1
    )
    assert "pip install blake3" in capsys.readouterr().err and not (tmp_path / "other").exists()


def test_a_mismatch_names_the_file_the_tensor_blake3_and_the_sidecar(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    path = write_blake3(ckpt_copy, store=store)
    shard = ckpt_copy / shard_of(ckpt_copy, "head.weight")
    st = shard.stat()
    poke(ckpt_copy, "head.weight", 7)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # looks fresh: only the hash can tell
    with pytest.raises(LoadError) as e:
        _load(ckpt_copy, store, verify="rank")
    msg = str(e.value)
    assert (
        f"{shard}: tensor head.weight: blake3" in msg and f"from {path}" in msg and "rank 0" in msg
    )

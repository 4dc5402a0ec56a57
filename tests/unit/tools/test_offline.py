"""plan (predicted and trusted digests), verify and manifest: the tools that need no GPU and no
world, and single-rank --verify digest loads against the operator's digest store."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import tpload
from tpload.attest.predict import predict
from tpload.cli import main
from tpload.model.errors import LoadError
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.tools.export import export
from tpload.tools.offline import verify_checkpoint

from ...helpers import edit_json, poke, shard_of


def rank_rows(out: str) -> list[list[str]]:
    """The rows of `plan`'s rank table (before its node table)."""
    ranks = out.split(" rank node", 1)[1].split("\n node ", 1)[0]
    return [line.split() for line in ranks.splitlines() if line.strip()[:1].isdigit()]


def test_plan_prints_every_rank_and_predicts_what_the_load_serves(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["plan", str(small_ckpt), "--tp", "2", "--kind", "expanded", "--digest"]) == 0
    rows = rank_rows(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["0", "1"] and [r[-1] for r in rows] == predict(
        small_ckpt, load_config(), Layout(2), "expanded"
    )
    one = predict(small_ckpt, load_config(), Layout(1), "expanded")
    assert tpload.load(small_ckpt, kind="expanded", progress=False).report.mine.digest == one[0]


def test_predictions_differ_by_kind_and_layout(small_ckpt: Path) -> None:
    packed, expanded = (
        predict(small_ckpt, load_config(), Layout(2), k) for k in ("packed", "expanded")
    )
    assert len(set(packed + expanded)) == 4
    assert predict(small_ckpt, load_config(), Layout(1), "packed")[0] not in packed


def write(root: Path, store: Path, tp: int = 1) -> int:
    return main(["plan", str(root), "--tp", str(tp), "--write", "--digest-store", str(store)])


def digest_load(root: Path, store: Path, **kw: object) -> tpload.RankShards:
    return tpload.load(root, verify="digest", digest_store=str(store), progress=False, **kw)


def test_verify_digest_trusts_only_fresh_sha256_verified_digests(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with pytest.raises(LoadError, match=r"holds nothing for tp1-ep1-packed-config-") as e:
        digest_load(ckpt_copy, store)  # nothing stored: refused before any byte is read
    assert f"plan {ckpt_copy} --tp 1 --ep 1 --kind packed" in str(e.value)
    assert write(ckpt_copy, store) == 0
    (path,) = store.glob("*.json")
    assert (
        oct(path.stat().st_mode & 0o777) == "0o600" and oct(store.stat().st_mode & 0o777) == "0o700"
    )
    shards = digest_load(ckpt_copy, store)
    assert (
        shards.report.predictions.startswith("matched (sha256-verified")
        and shards.report.mine.bytes_hashed == 0
    )
    # a changed byte whose shard keeps its size and mtime: the fingerprints still catch it
    shard = ckpt_copy / shard_of(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight")
    stat = shard.stat()
    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 0)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(
        LoadError, match=r"rank 0: digest \w+\.\.\. differs from the prediction stored in"
    ):
        digest_load(ckpt_copy, store)
    poke(
        ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 0
    )  # a rewritten shard (new mtime): stale, refused
    with pytest.raises(LoadError, match=f"shard {shard.name} changed \\(size or mtime\\)"):
        digest_load(ckpt_copy, store)


def test_digests_planted_in_the_checkpoint_folder_are_not_trusted(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    assert (
        write(ckpt_copy, tmp_path / "elsewhere") == 0
    )  # an attacker's store, copied into the folder
    for f in (tmp_path / "elsewhere").glob("*.json"):
        (ckpt_copy / "TPLOAD_DIGESTS.json").write_text(f.read_text())
        (ckpt_copy / f.name).write_text(f.read_text())
    with pytest.raises(LoadError, match="holds nothing for"):
        digest_load(ckpt_copy, store)


def test_a_store_others_can_write_is_refused(small_ckpt: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert write(small_ckpt, store) == 0
    store.chmod(0o777)
    with pytest.raises(
        LoadError, match="writable by others .* whoever can write it decides what is served"
    ):
        digest_load(small_ckpt, store)


def test_the_manifest_pin(small_ckpt: Path) -> None:
    import hashlib

    real = hashlib.sha256((small_ckpt / "NATIVE_MANIFEST.json").read_bytes()).hexdigest()
    assert (
        tpload.load(small_ckpt, manifest_sha256=real.upper(), progress=False).report.mine.tensors
        > 0
    )
    with pytest.raises(
        LoadError, match="is not the pinned 0000000000000000... .* not the checkpoint you pinned"
    ):
        tpload.load(small_ckpt, manifest_sha256="0" * 64, progress=False)


def test_verify_digest_without_a_manifest_says_to_write_one(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    (ckpt_copy / "NATIVE_MANIFEST.json").unlink()
    with pytest.raises(
        LoadError, match="manifest missing, .* write a manifest: `python -m tpload manifest "
    ):
        digest_load(ckpt_copy, tmp_path / "store")
    assert write(ckpt_copy, tmp_path / "store") == 1  # plan --write refuses too, saying the same


def test_plan_write_refuses_a_checkpoint_that_fails_sha256(
    ckpt_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.2.w3.weight", 7)
    assert write(ckpt_copy, tmp_path / "store") == 1
    err = capsys.readouterr().err
    assert "mtp.0.ffn.experts.2.w3.weight" in err and "sha256" in err
    assert not list((tmp_path / "store").glob("*.json"))


def hooked_run(
    monkeypatch: pytest.MonkeyPatch, after_first: Callable[[], None], at: int = 1
) -> list[object]:
    """Wrap the load's own run() as predict calls it: ``after_first`` runs once rank ``at - 1`` is
    done (a writer changing the checkpoint between the opening and the end); the storages it ran
    on."""
    from tpload.attest import predict as offline

    real, seen = offline.run, []

    def run(storage: object, *args: object, **kw: object) -> object:
        seen.append(storage)
        result = real(storage, *args, **kw)
        if len(seen) == at:
            after_first()
        return result

    monkeypatch.setattr(offline, "run", run)
    return seen


def test_plan_write_computes_every_rank_from_one_opening(
    ckpt_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = hooked_run(monkeypatch, lambda: None)
    assert write(ckpt_copy, tmp_path / "store", tp=2) == 0
    assert (
        len(seen) == 2 and seen[0] is seen[1]
    )  # the store key, the stamp and both ranks: one opening
    assert len(list((tmp_path / "store").glob("*.json"))) == 1


def test_plan_write_stores_nothing_when_a_shard_moves_meanwhile(
    ckpt_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    shard = ckpt_copy / shard_of(ckpt_copy, "head.weight")
    # after the last rank: only the end check can see it
    hooked_run(monkeypatch, lambda: os.utime(shard, ns=(1, 1)), at=2)  # same bytes, another stamp
    assert write(ckpt_copy, tmp_path / "store", tp=2) == 1
    err = capsys.readouterr().err
    assert (
        "nothing stored" in err
        and f"shard {shard.name} changed while the digests were computed" in err
    )
    assert not list((tmp_path / "store").glob("*.json"))
    # after the first: the next rank's reads see the shard changed under its handle
    monkeypatch.undo()
    hooked_run(monkeypatch, lambda: os.utime(shard, ns=(2, 2)), at=1)
    assert write(ckpt_copy, tmp_path / "store", tp=2) == 1
    err = capsys.readouterr().err
    assert f"{shard.name}: it changed while it was loaded" in err and "cannot be trusted" in err
    assert not list((tmp_path / "store").glob("*.json"))


def test_plan_write_stores_nothing_when_the_manifest_moves_meanwhile(
    ckpt_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    # the same entries, other bytes: another manifest sha256, the key the digests would be stored
    # under
    hooked_run(
        monkeypatch, lambda: manifest.write_text(json.dumps(json.loads(manifest.read_text()))), at=2
    )
    assert write(ckpt_copy, tmp_path / "store", tp=2) == 1
    err = capsys.readouterr().err
    assert "nothing stored" in err and "the manifest changed while the digests were computed" in err
    assert not list((tmp_path / "store").glob("*.json"))


def test_verify_lists_every_bad_tensor(ckpt_copy: Path, capsys: pytest.CaptureFixture) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.1.w1.weight", 5)
    poke(ckpt_copy, "head.weight", 9)
    poke(ckpt_copy, "mtp.0.ffn.experts.4.w2.scale", 0, 0xFF, fix_manifest=True)
    edit_json(ckpt_copy / "NATIVE_MANIFEST.json", lambda m: m["tensors"].pop("mtp.0.enorm.weight"))
    problems = verify_checkpoint(ckpt_copy, load_config())
    text = "\n".join(problems)
    assert len(problems) == 4, text
    for needle in (
        "mtp.0.ffn.experts.1.w1.weight: sha256",
        "head.weight: sha256",
        "tensor mtp.0.enorm.weight (in model-00001-of-00002.safetensors) is not in the manifest",
        "mtp.0.ffn.experts.4.w2.scale: 1 E8M0 scale bytes 0x00/0xFF",
    ):
        assert needle in text
    assert main(["verify", str(ckpt_copy)]) == 1
    out = capsys.readouterr().out
    assert out.count("BAD ") == 4 and "4 problem(s)" in out


def test_verify_passes_a_good_checkpoint_and_an_export(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["verify", str(small_ckpt)]) == 0 and capsys.readouterr().out.strip().endswith("OK")
    export(small_ckpt, tmp_path / "x", Layout(2), load_config())
    assert (
        main(["verify", str(tmp_path / "x")]) == 0
    )  # an export loads fine: verify must accept it too
    with open(tmp_path / "x" / "rank-00001-of-00002.safetensors", "r+b") as f:
        f.seek(-100, 2)
        b = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([b[0] ^ 1]))
    assert main(["verify", str(tmp_path / "x")]) == 1
    assert "rank-00001-of-00002.safetensors" in capsys.readouterr().out


def test_plan_accepts_an_export(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    export(small_ckpt, tmp_path / "x", Layout(2), load_config())
    assert main(["plan", str(tmp_path / "x"), "--tp", "2", "--digest"]) == 0
    rows = rank_rows(capsys.readouterr().out)
    assert [r[-1] for r in rows] == predict(
        small_ckpt, load_config(), Layout(2), "packed"
    )  # the source's


def test_manifest_writes_refuses_and_forces(ckpt_copy: Path) -> None:
    original = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"]
    (ckpt_copy / "NATIVE_MANIFEST.json").unlink()
    assert main(["manifest", str(ckpt_copy)]) == 0
    assert json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"] == original
    assert main(["manifest", str(ckpt_copy)]) == 1  # refuses to overwrite
    (ckpt_copy / "NATIVE_MANIFEST.json").write_text("{broken")  # --force replaces even a broken one
    assert main(["manifest", str(ckpt_copy), "--force"]) == 0
    assert json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"] == original


def test_manifest_hash_blake3_refuses_a_tensor_that_fails_sha256_and_writes_nothing(
    ckpt_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("blake3")
    store = tmp_path / "store"
    manifest = (ckpt_copy / "NATIVE_MANIFEST.json").read_bytes()
    poke(ckpt_copy, "mtp.0.ffn.experts.2.w3.weight", 7)
    assert main(["manifest", str(ckpt_copy), "--hash", "blake3", "--digest-store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "no blake3 digests written" in err and "mtp.0.ffn.experts.2.w3.weight: sha256" in err
    assert (
        not list(store.glob("*.blake3.json"))
        and (ckpt_copy / "NATIVE_MANIFEST.json").read_bytes() == manifest
    )


def test_manifest_hash_blake3_writes_a_missing_manifest_first(
    ckpt_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("blake3")
    original = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"]
    (ckpt_copy / "NATIVE_MANIFEST.json").unlink()
    assert (
        main(
            [
                "manifest",
                str(ckpt_copy),
                "--hash",
                "blake3",
                "--digest-store",
                str(tmp_path / "store"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"] == original
    (side,) = (tmp_path / "store").glob("*.blake3.json")
    assert f"wrote {side}: every tensor's sha256 matched the manifest" in out
    assert sorted(json.loads(side.read_text())["tensors"]) == sorted(original)


@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_an_export_of_stacked_experts_serves_what_the_source_serves(
    tmp_path: Path, kind: str
) -> None:
    """gpt-oss's experts are stacked and cut on inner dimensions (their windows are boxes of another
    view of the bytes): an export must write each window in that view's order, so that loading the
    export gives the source's digests."""
    from tpload.tools.published import write_published

    src = write_published(tmp_path / "src", "gpt-oss-tiny")
    config, layout = load_config("gpt-oss"), Layout(2, 2)
    export(src, tmp_path / "x", layout, config)
    assert predict(tmp_path / "x", config, layout, kind) == predict(src, config, layout, kind)


def test_plan_write_stores_each_rank_s_tensor_fingerprints_and_a_mismatch_names_the_tensor(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    from tpload.verification.store import DigestStore

    store = tmp_path / "store"
    assert write(ckpt_copy, store) == 0
    (path,) = store.glob("*.json")
    (side,) = store.glob("*.windows")  # beside the digests, not one more *.json
    assert oct(side.stat().st_mode & 0o777) == "0o600"
    doc = json.loads(path.read_text())
    (key,) = doc["layouts"]
    sha, digests = doc["manifest_sha256"], doc["layouts"][key]["digests"]
    (windows,) = DigestStore(store).read_windows(sha, key, digests)
    assert len(windows) == 62  # every tensor the rank serves
    assert DigestStore(store).read_windows(sha, key, ["0" * 64]) is None  # other digests: not these
    # a prediction that differs in one tensor's line: the load names that tensor
    side_doc = json.loads(side.read_text())
    name = sorted(side_doc["windows"][0])[3]
    side_doc["windows"][0][name][0] += 1
    side_doc["digests"][0] = doc["layouts"][key]["digests"][0] = "0" * 64
    side.write_text(json.dumps(side_doc))
    path.write_text(json.dumps(doc))
    with pytest.raises(LoadError) as e:
        digest_load(ckpt_copy, store)
    assert f"differs from the prediction stored in {path} ({key}, position 0)" in str(e.value)
    assert f": 1 served tensor(s) differ: {name}" in str(e.value)

"""Hugging Face hub cache snapshots (tpload/storage/hub.py): ``snapshots/REV/FILE`` links to
``blobs/HASH``, the hash being the sha256 of an LFS file or the git blob SHA-1 of a small one.

Checked against independent computations (hashlib, os.readlink): git's blob hash, the folder
shape :func:`to_hub_cache` makes, :func:`is_snapshot`, the refusals of files that cannot be checked
by their blob names (a regular file, a link out of ``blobs``, a blob not named by a hash), a
corrupt small file, the shard digests, and a load of a snapshot (a corrupt shard; a shard stored
as a plain git object).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import tpload
from tpload.model.errors import CheckpointError
from tpload.planning.layout import Layout
from tpload.storage import hub
from tpload.storage.sharded import ShardedStorage
from tpload.tools.published import write_published
from tpload.verification import gate, strategy

REPO = "org/tiny-llama"


def sha1_blob(data: bytes) -> str:
    """git hash-object, written out: sha1 of b"blob <size>\\0" + data."""
    h = hashlib.sha1()
    h.update(b"blob " + str(len(data)).encode() + b"\0")
    h.update(data)
    return h.hexdigest()


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """llama-tiny (no manifest: the blob names vouch for it) moved into a hub cache."""
    src = write_published(tmp_path / "src", "llama-tiny", manifest=False)
    return hub.to_hub_cache(src, tmp_path / "cache", REPO)


def blob_of(link: Path) -> Path:
    return link.parent / os.readlink(link)


# -- git's blob hash


@pytest.mark.parametrize("data", [b"", b"hello\n", bytes(range(256)) * 41, b'{"a": 1}'])
def test_git_blob_sha1_is_gits_object_name(data: bytes) -> None:
    assert hub.git_blob_sha1(data) == sha1_blob(data)


def test_git_blob_sha1_known_values() -> None:
    # `printf 'hello\n' | git hash-object --stdin`, and the empty blob every git knows
    assert hub.git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert hub.git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


# -- the folder shape


def test_to_hub_cache_links_every_file_to_its_hash_named_blob(tmp_path: Path) -> None:
    src = write_published(tmp_path / "src", "llama-tiny", manifest=False)
    contents = {p.name: p.read_bytes() for p in src.iterdir()}
    snap = hub.to_hub_cache(src, tmp_path / "cache", REPO)
    top = tmp_path / "cache" / "models--org--tiny-llama"
    assert snap.parent == top / "snapshots"
    assert (top / "refs" / "main").read_text() == snap.name
    assert list(src.iterdir()) == []  # moved, not copied
    assert sorted(p.name for p in snap.iterdir()) == sorted(contents)
    for name, data in contents.items():
        link = snap / name
        target = os.readlink(link)
        assert link.is_symlink() and not os.path.isabs(target)
        assert Path(os.path.normpath(snap / target)).parent == top / "blobs"
        want = (
            hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else sha1_blob(data)
        )
        assert Path(target).name == want
        assert blob_of(link).read_bytes() == data
    assert sorted(p.name for p in (top / "blobs").iterdir()) == sorted(
        Path(os.readlink(snap / n)).name for n in contents
    )


def test_is_snapshot(snapshot: Path, tmp_path: Path) -> None:
    assert hub.is_snapshot(snapshot)
    plain = write_published(tmp_path / "plain", "llama-tiny", manifest=False)
    assert not hub.is_snapshot(plain)
    assert not hub.is_snapshot(snapshot.parent.parent / "blobs")
    fake = tmp_path / "x" / "snapshots" / "rev"  # named like one, but no blobs beside it
    fake.mkdir(parents=True)
    assert not hub.is_snapshot(fake)


# -- what the blob names promise


def test_blobs_reads_the_algorithm_from_the_name(snapshot: Path) -> None:
    files = sorted(p.name for p in snapshot.iterdir())
    named = hub.blobs(snapshot, files)
    for name in files:
        digest = Path(os.readlink(snapshot / name)).name
        algorithm = "sha256" if name.endswith(".safetensors") else "git-sha1"
        assert named[name] == hub.Blob(algorithm, digest)


def test_a_regular_file_in_a_snapshot_is_refused_naming_it(snapshot: Path) -> None:
    config = snapshot / "config.json"
    data = config.read_bytes()
    config.unlink()
    config.write_bytes(data)  # copied in by hand: nothing names its hash
    with pytest.raises(CheckpointError) as e:
        hub.blobs(snapshot, ["config.json", "model.safetensors.index.json"])
    message = str(e.value)
    assert (
        "config.json: not a link into" in message and "model.safetensors.index.json" not in message
    )
    with pytest.raises(CheckpointError, match="config.json: not a link into"):
        hub.check_small_files(snapshot)


def test_a_link_out_of_blobs_is_refused_naming_it(snapshot: Path, tmp_path: Path) -> None:
    shard = sorted(snapshot.glob("*.safetensors"))[0]
    elsewhere = (
        tmp_path / "elsewhere" / Path(os.readlink(shard)).name
    )  # even named by the right hash
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(elsewhere)
    with pytest.raises(CheckpointError) as e:
        hub.shard_digests(snapshot, [shard.name])
    assert f"{shard.name}: not a link into" in str(e.value)


def test_a_blob_not_named_by_a_hash_is_refused(snapshot: Path) -> None:
    index = snapshot / "model.safetensors.index.json"
    blobs = snapshot.parent.parent / "blobs"
    os.replace(blob_of(index), blobs / "index-blob")
    index.unlink()
    index.symlink_to(os.path.relpath(blobs / "index-blob", snapshot))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors\.index\.json: its blob index-blob is not named by",
    ):
        hub.blobs(snapshot, [index.name])


def test_every_bad_file_is_listed_at_once(snapshot: Path) -> None:
    for name in ("config.json", "model.safetensors.index.json"):
        link = snapshot / name
        data = link.read_bytes()
        link.unlink()
        link.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"2 file\(s\) of the hub snapshot"):
        hub.check_small_files(snapshot)


def test_a_corrupt_small_file_is_refused(snapshot: Path) -> None:
    blob = blob_of(snapshot / "config.json")
    blob.write_bytes(blob.read_bytes().replace(b"4", b"5", 1))  # one digit of a dimension
    with pytest.raises(CheckpointError) as e:
        hub.check_small_files(snapshot)
    message = str(e.value)
    assert "config.json" in message and "corrupt" in message and "git-sha1" in message
    with pytest.raises(CheckpointError, match="config.json.*corrupt"):
        ShardedStorage(snapshot)  # before anything reads it


def test_intact_small_files_pass(snapshot: Path) -> None:
    hub.check_small_files(snapshot)


def test_shard_digests_are_the_blob_names_and_the_sha256_of_the_bytes(snapshot: Path) -> None:
    shards = sorted(p.name for p in snapshot.glob("*.safetensors"))
    assert len(shards) == 2
    digests = hub.shard_digests(snapshot, shards)
    assert digests == {s: hashlib.sha256((snapshot / s).read_bytes()).hexdigest() for s in shards}
    assert digests == {s: Path(os.readlink(snapshot / s)).name for s in shards}
    storage = ShardedStorage(snapshot)
    try:
        assert storage.file_digests == {snapshot / s: d for s, d in digests.items()}
        assert storage.manifest_problems(storage.catalogue.names()) == []
    finally:
        storage.close()


def _as_git_object(snapshot: Path, name: str) -> None:
    """Re-store one file as a plain git object: its blob renamed to the git SHA-1 of its bytes."""
    link = snapshot / name
    data = link.read_bytes()
    blobs = snapshot.parent.parent / "blobs"
    os.replace(blob_of(link), blobs / sha1_blob(data))
    link.unlink()
    link.symlink_to(os.path.relpath(blobs / sha1_blob(data), snapshot))


def test_a_shard_stored_as_a_git_object_is_checked_whole_by_sha1(snapshot: Path) -> None:
    first, second = sorted(p.name for p in snapshot.glob("*.safetensors"))
    _as_git_object(snapshot, first)
    # the LFS shard by its blob name; the git object by the sha256 of the bytes its SHA-1 vouched
    # for
    assert hub.shard_digests(snapshot, [first, second]) == {
        first: hashlib.sha256((snapshot / first).read_bytes()).hexdigest(),
        second: Path(os.readlink(snapshot / second)).name,
    }
    blob = blob_of(snapshot / first)
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0xFF
    blob.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=f"{first}.*corrupt"):
        hub.shard_digests(snapshot, [first, second])


# -- loading a snapshot


def test_a_snapshot_loads_without_a_manifest(snapshot: Path) -> None:
    shards = tpload.load(snapshot, progress=False)
    assert any("hub cache snapshot: 2 file(s) checked whole" in n for n in shards.report.notes)
    assert len(shards.state_dict()) == 21


def test_a_corrupt_shard_fails_the_load_naming_the_file(snapshot: Path) -> None:
    shard = sorted(snapshot.glob("*.safetensors"))[1]
    blob = blob_of(shard)
    raw = bytearray(blob.read_bytes())
    raw[-3] ^= 0x01  # inside the last tensor's data
    blob.write_bytes(bytes(raw))
    with pytest.raises(
        tpload.LoadError, match=f"{shard.name}: file sha256 .* is not .*the file is corrupt"
    ):
        tpload.load(snapshot, progress=False)


def test_a_deferred_tensor_changed_after_the_load_names_its_blob_not_a_manifest(
    snapshot: Path,
) -> None:
    """A snapshot has no manifest: the locator's digest was taken while its file was hashed whole
    against the blob name, and its stream's refusal says so."""
    shards = tpload.load(snapshot, progress=False, defer=("lm_head.weight",))
    (d,) = shards.deferred()
    assert d.vouched_by.endswith("against its hub blob name")
    b"".join(d.chunks())  # as loaded: it streams
    blob = blob_of(snapshot / Path(d.path).name)
    with open(blob, "r+b") as fh:
        fh.seek(d.offset + 5)
        byte = fh.read(1)
        fh.seek(d.offset + 5)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointError) as e:
        b"".join(d.chunks())
    message = str(e.value)
    assert "lm_head.weight: sha256 " in message, message
    assert "manifest" not in message, message  # the folder has none
    assert (
        f"{d.sha256[:16]}..., the sha256 taken of it while its file was hashed whole against its "
        "hub blob name (the file changed since the load?)"
    ) in message, message
    with pytest.raises(
        tpload.LoadError, match="no manifest, but --manifest-sha256 pins 0000000000000000"
    ):
        tpload.load(snapshot, progress=False, manifest_sha256="0" * 64)


def test_a_snapshot_with_a_shard_stored_as_a_git_object_loads(snapshot: Path) -> None:
    _as_git_object(snapshot, sorted(p.name for p in snapshot.glob("*.safetensors"))[0])
    assert len(tpload.load(snapshot, progress=False).state_dict()) == 21


def test_a_manifest_written_into_a_snapshot_is_used_and_keeps_it_loadable(snapshot: Path) -> None:
    """`tpload manifest` on a snapshot (what the amplification note recommends for ep layouts)
    writes a regular file among the links; the snapshot stays loadable, now verified per tensor."""
    from tpload.tools.offline import write_manifest

    write_manifest(snapshot)
    assert (snapshot / "NATIVE_MANIFEST.json").is_file() and not (
        snapshot / "NATIVE_MANIFEST.json"
    ).is_symlink()
    shards = tpload.load(snapshot, progress=False)
    assert not any(
        "hub cache snapshot" in n for n in shards.report.notes
    )  # per tensor, not whole files
    assert shards.report.mine.hashed == len(shards.state_dict())


def test_auto_config_checks_a_snapshots_config_json_before_believing_it(snapshot: Path) -> None:
    from tpload.loading.pick import choose

    blob = blob_of(snapshot / "config.json")
    blob.write_text(blob.read_text().replace("LlamaForCausalLM", "GptOssForCausalLM"))
    with pytest.raises(CheckpointError, match="config.json.*corrupt"):
        choose("auto", snapshot)


def test_verify_at_rest_checks_a_snapshot_by_its_blob_names(snapshot: Path) -> None:
    from tpload.selection.config import load_config
    from tpload.tools.offline import verify_checkpoint

    assert verify_checkpoint(snapshot, load_config("llama")) == []
    shard = sorted(snapshot.glob("*.safetensors"))[1]
    blob = blob_of(shard)
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0x01
    blob.write_bytes(bytes(raw))
    problems = verify_checkpoint(snapshot, load_config("llama"))
    assert len(problems) == 1 and shard.name in problems[0] and "blob is named by" in problems[0]


def test_a_manifest_is_not_written_over_a_corrupt_snapshot(snapshot: Path) -> None:
    from tpload.tools.offline import write_manifest

    shard = sorted(snapshot.glob("*.safetensors"))[0]
    blob = blob_of(shard)
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0x01
    blob.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=f"(?s)no manifest written.*{shard.name}"):
        write_manifest(snapshot)
    assert not (snapshot / "NATIVE_MANIFEST.json").exists()


def anchor_of(root: Path) -> str:
    """The trust anchor a load of ``root`` names in its handshake (the gate's strategy's)."""
    opts = SimpleNamespace(
        kind="packed", digest_store="/nonexistent", verify="node", checkpoint=None
    )
    ctx = SimpleNamespace(rank=0, world=1, node_peers=[0], node_lists=[[0]])
    job = strategy.Job(opts, ctx, ShardedStorage(root), {}, "x", Layout(1, 1), dict)
    return gate.strategy(job).anchor()


def snapshot_with(tmp_path: Path, name: str, change=None) -> Path:
    src = write_published(tmp_path / name, "llama-tiny", manifest=False)
    if change is not None:
        change(src)
    return hub.to_hub_cache(src, tmp_path / f"cache-{name}", REPO)


def test_the_anchor_covers_the_files_that_shape_the_plan_not_the_tokenizer(tmp_path: Path) -> None:
    """Two snapshots of the same shards, one on another revision whose config.json says other head
    counts: before, the anchor hashed the shards' digests only, so both named one anchor."""

    def heads(src: Path) -> None:
        model = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**model, "num_key_value_heads": 4}))

    def tokenizer(src: Path) -> None:
        (src / "tokenizer.json").write_text('{"model": {}}')
        (src / "README.md").write_text("# a model card\n")

    one = snapshot_with(tmp_path, "one")
    same, other = (
        snapshot_with(tmp_path, "same", tokenizer),
        snapshot_with(tmp_path, "other", heads),
    )
    shards = {q.name: d for q, d in ShardedStorage(one).file_digests.items()}
    for snap in (same, other):  # the same shards, by the same blob names
        assert {q.name: d for q, d in ShardedStorage(snap).file_digests.items()} == shards
    anchor = anchor_of(one)
    assert anchor.startswith("hub cache snapshot digests "), anchor
    assert anchor_of(same) == anchor  # the tokenizer and README shape nothing the load serves
    assert anchor_of(other) != anchor
    blob = Path(os.readlink(other / "config.json")).name
    assert ShardedStorage(other).anchor_files == {
        other / "config.json": f"git-sha1:{blob}",
        other / "model.safetensors.index.json": "git-sha1:"
        + Path(os.readlink(other / "model.safetensors.index.json")).name,
    }

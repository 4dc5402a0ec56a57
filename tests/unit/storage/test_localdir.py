"""huggingface_hub local-dir downloads (tpload/storage/localdir.py): ``DIR/.cache/huggingface/
download/<file>.metadata`` holds the commit, the etag (an LFS file's sha256, a git file's blob
SHA-1) and when it was written.

The metadata is written and read back by huggingface_hub's own ``_local_folder`` functions, so the
format and the staleness rule are the library's, not a copy of them. Loads run in one process
(world 1): verified with no flag, a corrupt shard or JSON file refused naming it, unvouched files
(missing, stale, hostile metadata) named with the ways on; ``verify`` and ``manifest`` on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import tpload
from tpload.model.errors import CheckpointError, LoadError
from tpload.storage import localdir
from tpload.storage.sharded import ShardedStorage
from tpload.tools.published import write_published

hf_local = pytest.importorskip("huggingface_hub._local_folder")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def as_local_dir(folder: Path, commit: str = COMMIT, *, skip: tuple[str, ...] = ()) -> Path:
    """Give each file of ``folder`` the download metadata ``hf download --local-dir`` leaves,
    written by huggingface_hub itself: the sha256 etag of an LFS file (the shards), the git SHA-1 of
    the rest."""
    for f in sorted(p for p in folder.iterdir() if p.is_file() and p.name not in skip):
        data = f.read_bytes()
        etag = hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors" else git_sha1(data)
        hf_local.write_download_metadata(folder, f.name, commit, etag)
    return folder


def flip(path: Path, offset: int) -> None:
    """One byte flipped in place, the file's times kept (so its metadata stays fresh: only the hash
    sees it)."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return as_local_dir(write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False))


def shards(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


# -- the format: huggingface_hub's own writer and reader


def test_tpload_reads_the_metadata_as_huggingface_hub_does(local: Path) -> None:
    for f in sorted(p.name for p in local.iterdir() if p.is_file()):
        theirs = hf_local.read_download_metadata(local, f)
        ours = localdir.judge(local, f)
        assert theirs is not None and isinstance(ours, localdir.Metadata), (f, ours)
        assert (ours.commit, ours.blob.digest, ours.timestamp) == (
            theirs.commit_hash,
            theirs.etag,
            theirs.timestamp,
        )
        assert ours.blob.algorithm == ("sha256" if f.endswith(".safetensors") else "git-sha1")
        assert ours.path == hf_local.get_local_download_paths(local, f).metadata_path


@pytest.mark.parametrize(("after", "fresh"), [(0.5, True), (0.99, True), (1.5, False), (60, False)])
def test_stale_as_huggingface_hub_judges_it(local: Path, after: float, fresh: bool) -> None:
    shard = shards(local)[0]
    stamp = hf_local.read_download_metadata(local, shard.name).timestamp
    os.utime(shard, (stamp + after, stamp + after))
    assert (hf_local.read_download_metadata(local, shard.name) is not None) is fresh
    got = localdir.judge(local, shard.name)
    assert isinstance(got, localdir.Metadata) is fresh, got
    if not fresh:
        assert got.startswith(f"{shard.name}: stale download metadata"), got


# -- loading it


def test_a_local_dir_download_loads_verified_with_no_flag(local: Path) -> None:
    s = tpload.load(local, progress=False)
    note = next(n for n in s.report.notes if n.startswith("local-dir download"))
    assert note.startswith(
        f"local-dir download (commit {COMMIT[:12]}): 2 file(s) checked whole against their "
        "local-dir etags"
    ), note
    assert (
        s.vouched_by
        == "the etag each file's local-dir download metadata records (files hashed whole)"
    )
    assert s.report.mine.bytes_hashed == sum(p.stat().st_size for p in shards(local))
    assert len(s.state_dict()) > 0


def test_a_flipped_byte_fails_naming_the_file_and_its_etag(local: Path) -> None:
    shard = shards(local)[1]
    flip(
        shard, shard.stat().st_size - 2
    )  # the data, not the header: only the whole-file hash sees it
    with pytest.raises(
        LoadError,
        match=f"{shard.name}: file sha256 .* is not .*local-dir download metadata.*corrupt",
    ):
        tpload.load(local, progress=False)


def test_config_json_is_checked_by_its_git_sha1_before_it_picks_the_config(local: Path) -> None:
    from tpload.loading.pick import choose

    cfg = local / "config.json"
    st = cfg.stat()
    cfg.write_text(cfg.read_text().replace("GptOssForCausalLM", "LlamaForCausalLM"))
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))  # fresh by mtime: only the SHA-1 sees it
    with pytest.raises(
        CheckpointError,
        match="config.json: its bytes have git-sha1 .* its local-dir etag .*corrupt",
    ):
        choose("auto", local)
    with pytest.raises(LoadError, match="config.json: .*local-dir etag"):
        tpload.load(local, progress=False)


def test_a_file_without_metadata_is_named_with_the_ways_on(tmp_path: Path) -> None:
    src = write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False)
    second = shards(src)[1].name
    as_local_dir(src, skip=(second,))
    with pytest.raises(LoadError) as e:
        tpload.load(src, progress=False)
    msg = str(e.value)
    assert "1 of its 4 file(s) have no download metadata that vouches for them" in msg, msg
    assert f"{second}: no download metadata" in msg and shards(src)[0].name not in msg, msg
    assert "python -m tpload manifest" in msg and "--verify off" in msg, msg
    # the ways on work: unchecked, loudly; or a manifest of the bytes as they are
    assert tpload.load(src, progress=False, verify="off").vouched_by == "nothing (--verify off)"


def test_a_json_file_without_metadata_is_unvouched_too(tmp_path: Path) -> None:
    src = as_local_dir(
        write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False), skip=("config.json",)
    )
    with pytest.raises(
        LoadError, match="1 of its 4 file\\(s\\).*\n    - config.json: no download metadata"
    ):
        tpload.load(src, progress=False)


def test_a_metadata_folder_linked_out_of_the_folder_is_not_trusted(
    local: Path, tmp_path: Path
) -> None:
    meta = local / ".cache" / "huggingface"
    os.replace(meta, tmp_path / "elsewhere")
    meta.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LoadError, match="download metadata lies out of the folder .*not trusted"):
        tpload.load(local, progress=False)


def test_a_download_copied_with_cp_r_is_checked_against_its_etags(
    local: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`cp -r` gives every file a new mtime, so huggingface_hub would call each one's metadata
    stale; the etags are the files' digests, so tpload hashes each file against its own instead."""
    import subprocess
    import time

    from tpload.cli import main

    time.sleep(1.1)  # past huggingface_hub's 1 s allowance
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(local), str(copy)], check=True)
    assert all(
        isinstance(got, localdir.Metadata) and got.stale
        for got in (localdir.judge(copy, p.name, stale_ok=True) for p in shards(copy))
    )
    s = tpload.load(copy, progress=False)
    assert s.report.mine.bytes_hashed == sum(p.stat().st_size for p in shards(copy))
    assert any(n.startswith("local-dir download") for n in s.report.notes)
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 0
    assert "against the etag its local-dir download metadata records" in capsys.readouterr().out
    # a copied shard whose bytes changed: its etag catches it, naming the file
    shard = shards(copy)[1]
    flip(shard, shard.stat().st_size - 2)
    with pytest.raises(LoadError, match=f"{shard.name}: file sha256 .* is not .*corrupt"):
        tpload.load(copy, progress=False)
    from tpload.tools.offline import write_manifest

    write_manifest(copy)  # modified since the download: vouched for as it is now, as before
    assert len(tpload.load(copy, progress=False).state_dict()) > 0


def test_a_json_file_modified_since_its_download_is_unvouched_until_a_manifest_vouches(
    local: Path,
) -> None:
    cfg = local / "config.json"
    later = cfg.stat().st_mtime + 3600  # modified since the download, as huggingface_hub judges
    cfg.write_text(cfg.read_text().replace("}", ', "note": "mine"}', 1))
    os.utime(cfg, (later, later))
    with pytest.raises(LoadError) as e:
        tpload.load(local, progress=False)
    msg = str(e.value)
    assert "- config.json: modified since its download (its mtime is later than its " in msg, msg
    assert "python -m tpload manifest" in msg
    from tpload.tools.offline import write_manifest

    write_manifest(local)  # the operator vouches for the bytes as they are now
    assert len(tpload.load(local, progress=False).state_dict()) > 0


def _hostile(local: Path, kind: str) -> Path:
    meta = localdir.metadata_path(local, shards(local)[0].name)
    if kind == "malformed":
        meta.write_text(f"{COMMIT}\n")
    elif kind == "huge":
        meta.write_text(meta.read_text() + "x" * 100_000)
    elif kind == "not hex":
        lines = meta.read_text().split("\n")
        meta.write_text("\n".join([lines[0], 'W/"zz' + lines[1][5:] + '"', *lines[2:]]))
    elif kind == "timestamp":
        lines = meta.read_text().split("\n")
        meta.write_text("\n".join([*lines[:2], "nan", *lines[3:]]))
    elif kind == "link out":
        outside = local.parent / "elsewhere.metadata"
        outside.write_text(meta.read_text())
        meta.unlink()
        meta.symlink_to(outside)
    return meta


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("malformed", "has 2 line"),
        ("huge", "bytes, not three short lines"),
        ("not hex", "is not a sha256"),
        ("timestamp", "is not a number"),
        ("link out", "is a link"),
    ],
)
def test_hostile_metadata_is_one_line_naming_it(local: Path, kind: str, said: str) -> None:
    meta = _hostile(local, kind)
    with pytest.raises(LoadError) as e:
        tpload.load(local, progress=False)
    line = next(x for x in str(e.value).splitlines() if str(meta) in x)
    assert said in line and line.endswith("not trusted"), line
    assert line.lstrip(" -").startswith(shards(local)[0].name), line


def test_a_manifest_outranks_the_metadata(local: Path) -> None:
    from tpload.tools.offline import write_manifest

    write_manifest(local)
    s = tpload.load(local, progress=False)
    assert not any(n.startswith("local-dir") for n in s.report.notes)  # per tensor, not whole files
    assert s.report.mine.hashed == len(s.state_dict())


def test_a_plain_folder_is_not_a_local_dir(tmp_path: Path) -> None:
    plain = write_published(tmp_path / "plain", "gpt-oss-tiny", manifest=False)
    assert not localdir.is_local_dir(plain)
    storage = ShardedStorage(plain)
    try:
        assert storage.local is None and storage.file_digests is None
        assert "is not a hub cache snapshot" in storage.manifest_problems([])[0]
    finally:
        storage.close()


# -- verify and manifest


def test_verify_checks_it_by_its_etags(local: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpload.cli import main
    from tpload.tools.offline import verify_checkpoint

    assert main(["verify", str(local)]) == 0
    assert "against the etag its local-dir download metadata records" in capsys.readouterr().out
    shard = shards(local)[0]
    flip(shard, shard.stat().st_size - 1)
    problems = verify_checkpoint(local, None)
    assert (
        len(problems) == 1
        and shard.name in problems[0]
        and "local-dir download metadata" in problems[0]
    ), problems


def test_verify_names_the_unvouched_and_checks_the_rest(tmp_path: Path) -> None:
    from tpload.tools.offline import verify_checkpoint

    src = write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False)
    first, second = (p.name for p in shards(src))
    as_local_dir(src, skip=(second,))
    flip(src / first, (src / first).stat().st_size - 1)
    problems = verify_checkpoint(src, None)
    assert any(f"\n    - {second}: no download metadata" in p for p in problems), problems
    assert any(p.startswith(str(src / first)) and "file sha256" in p for p in problems), problems


def test_manifest_refuses_to_vouch_for_a_file_that_fails_its_etag(local: Path) -> None:
    from tpload.tools.offline import write_manifest

    shard = shards(local)[1]
    flip(shard, shard.stat().st_size - 1)
    with pytest.raises(
        CheckpointError,
        match=f"no manifest written: 1 file\\(s\\) do not match their local-dir "
        f"etags:\n  - .*{shard.name}",
    ):
        write_manifest(local)
    assert not (local / "NATIVE_MANIFEST.json").exists()


def test_manifest_vouches_for_unvouched_files_as_they_are(tmp_path: Path) -> None:
    from tpload.tools.offline import write_manifest

    src = write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False)
    as_local_dir(src, skip=(shards(src)[1].name,))
    write_manifest(
        src
    )  # the way on the refusal names: trust on first use for the file without metadata
    assert len(tpload.load(src, progress=False).state_dict()) > 0


def test_the_anchor_covers_the_json_files_etags_not_only_the_shards(tmp_path: Path) -> None:
    """Two downloads of the same shards whose config.json differ (another revision): their
    anchors differ, where before they hashed the shards' etags only; a tokenizer file does not
    count (it shapes nothing the load serves)."""
    from .test_hub import anchor_of  # the gate's anchor of a folder

    def download(name: str, model: dict | None = None, tokenizer: bool = False) -> Path:
        src = write_published(tmp_path / name, "gpt-oss-tiny", manifest=False)
        if model is not None:
            (src / "config.json").write_text(json.dumps(model))
        if tokenizer:
            (src / "tokenizer.json").write_text("{}")
        return as_local_dir(src)

    one = download("one")
    model = json.loads((one / "config.json").read_text())
    other = download("other", {**model, "note": "another revision"})
    same = download("same", tokenizer=True)
    assert {p.name for p in ShardedStorage(one).file_digests} == {
        p.name for p in ShardedStorage(other).file_digests
    }
    assert anchor_of(one) == anchor_of(same) != anchor_of(other)
    etag = git_sha1((other / "config.json").read_bytes())
    assert ShardedStorage(other).anchor_files[other / "config.json"] == f"git-sha1:{etag}"

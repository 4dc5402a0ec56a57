"""The rules across options and on the paths they name, checked before any byte is read: a report
never written into the checkpoint, a digest store that can be a folder and is not inside the
checkpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import tpload
from tpload.model.errors import LoadError, OptionsError
from tpload.options.load_options import LoadOptions
from tpload.planning.layout import Layout
from tpload.selection.config import load_config


def test_a_report_into_a_missing_folder_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="folder .*nowhere does not exist"):
        LoadOptions.from_values({"report": str(tmp_path / "nowhere" / "r.json")})


def test_a_report_inside_the_checkpoint_is_refused_however_it_is_spelled(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    (tmp_path / "link").symlink_to(ckpt_copy)  # the folder through a symlink
    (tmp_path / "to-manifest").symlink_to(
        manifest
    )  # a report path that is a symlink to one of its files
    os.link(manifest, tmp_path / "hard")  # the same file under another name
    spellings = {
        manifest: "is inside the checkpoint",
        ckpt_copy / "new.json": "is inside the checkpoint",
        ckpt_copy / ".." / ckpt_copy.name / "r.json": "is inside the checkpoint",
        tmp_path / "link" / "r.json": "is inside the checkpoint",
        tmp_path / "to-manifest": "is inside the checkpoint",
        tmp_path / "hard": "is the checkpoint's NATIVE_MANIFEST.json",
    }
    for report, needle in spellings.items():
        with pytest.raises(OptionsError, match=f"report= {report} {needle}"):
            LoadOptions.from_values({"report": str(report), "checkpoint": ckpt_copy})
    LoadOptions.from_values(
        {"report": str(tmp_path / "r.json"), "checkpoint": ckpt_copy}
    )  # beside it: fine


def test_a_report_onto_a_hub_snapshot_s_blob_is_refused(tmp_path: Path) -> None:
    from tpload.cli import main

    assert (
        main(["synth", str(tmp_path / "hub"), "--preset", "deepseek-v3-tiny", "--hub", "org/m"])
        == 0
    )
    top = tmp_path / "hub" / "models--org--m"
    snap = next((top / "snapshots").iterdir())
    blob = (snap / "config.json").resolve()  # outside the snapshot folder, yet its config.json
    with pytest.raises(OptionsError, match=r"is the checkpoint's config\.json"):
        LoadOptions.from_values({"report": str(blob), "checkpoint": str(snap)})


def test_load_refuses_a_report_into_its_checkpoint_before_reading(small_ckpt: Path) -> None:
    manifest = small_ckpt / "NATIVE_MANIFEST.json"
    before = manifest.read_bytes()
    with pytest.raises(LoadError, match="the report never writes into the checkpoint it loads"):
        tpload.load(small_ckpt, report=str(manifest), progress=False)
    assert manifest.read_bytes() == before


@pytest.mark.parametrize(
    "store, needle",
    [
        ("file", "file is not a folder"),
        ("file/sub", "file is a file, so the folder cannot be made"),
    ],
)
def test_a_digest_store_that_cannot_be_a_folder_is_refused_first(
    tmp_path: Path, store: str, needle: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        OptionsError, match=f"digest_store= {tmp_path / store}: {tmp_path / needle}"
    ):
        LoadOptions.from_values({"digest_store": str(tmp_path / store)})
    LoadOptions.from_values(
        {"digest_store": str(tmp_path / "new" / "store")}
    )  # made when first written


INSIDE = "is inside the checkpoint"
NEVER = "trusted digests never live in the checkpoint they vouch for"


def test_a_digest_store_inside_the_checkpoint_is_refused_at_write_and_at_load(
    ckpt_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``plan --write`` (and ``manifest --hash blake3``) never writes trusted digests into the
    checkpoint they vouch for, however the store is spelled; a store already there (planted, or
    written by an older tpload) is refused by the load in every mode, before any byte is read."""
    from tpload.cli import main
    from tpload.tools.offline import record_verified

    (tmp_path / "link").symlink_to(ckpt_copy)
    spelled = [  # (argv tail, the environment's XDG_STATE_HOME, the store the message names)
        (["--digest-store", str(ckpt_copy / "store")], None, ckpt_copy / "store"),
        (["--digest-store", str(tmp_path / "link" / "s")], None, tmp_path / "link" / "s"),
        ([], str(ckpt_copy / "state"), ckpt_copy / "state" / "tpload"),
        ([], str(tmp_path / "link" / "state"), tmp_path / "link" / "state" / "tpload"),
    ]
    for tail, xdg, store in spelled:
        if xdg:
            monkeypatch.setenv("XDG_STATE_HOME", xdg)
        for argv in (
            ["plan", str(ckpt_copy), "--tp", "1", "--write", *tail],
            ["manifest", str(ckpt_copy), "--hash", "blake3", *tail],
            [str(ckpt_copy), "--no-progress", "--verify", "off", *tail],
        ):
            assert main(argv) == 1, argv
            err = " ".join(capsys.readouterr().err.split())
            assert f"the digest store {store}" in err and INSIDE in err and NEVER in err, err
            assert ("(the default, $XDG_STATE_HOME/tpload)" in err) == bool(xdg), err
        monkeypatch.undo()
    assert sorted(p.name for p in ckpt_copy.iterdir() if p.is_dir()) == []  # nothing written
    with pytest.raises(LoadError, match=f"the digest store {ckpt_copy / 's2'} {INSIDE}"):
        record_verified(  # the tool's own refusal, under whatever calls it (bench, the API)
            ckpt_copy, load_config("deepseek-v4-mtp"), Layout(1), "packed", store=ckpt_copy / "s2"
        )

    # a store written where it belongs, then put inside the checkpoint: never trusted from there
    outside = tmp_path / "store"
    assert (
        main(["plan", str(ckpt_copy), "--tp", "1", "--write", "--digest-store", str(outside)]) == 0
    )
    assert (
        main(
            [str(ckpt_copy), "--no-progress", "--verify", "digest", "--digest-store", str(outside)]
        )
        == 0
    )
    shutil.copytree(outside, ckpt_copy / "store")
    capsys.readouterr()
    for mode in ("digest", "node"):
        with pytest.raises(LoadError, match=f"the digest store {ckpt_copy / 'store'} {INSIDE}"):
            tpload.load(
                ckpt_copy, verify=mode, digest_store=str(ckpt_copy / "store"), progress=False
            )
    # beside the checkpoint, in a folder whose name starts like it: fine
    beside = ckpt_copy.parent / (ckpt_copy.name + "-store")
    LoadOptions.from_values({"digest_store": str(beside), "checkpoint": str(ckpt_copy)})


def test_a_digest_store_in_a_hub_cache_or_a_store_file_linked_into_the_checkpoint_is_refused(
    ckpt_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli import main
    from tpload.verification.store import DigestStore

    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (tmp_path / "to-blobs").symlink_to(repo / "blobs")
    for store in (repo / "blobs", repo / "store", repo / "snapshots" / "x", tmp_path / "to-blobs"):
        with pytest.raises(OptionsError, match=f"is inside the hub cache repository {repo}"):
            LoadOptions.from_values({"digest_store": str(store), "checkpoint": str(ckpt_copy)})
        argv = ["plan", str(ckpt_copy), "--tp", "1", "--write", "--digest-store", str(store)]
        assert main(argv) == 1
        assert f"is inside the hub cache repository {repo}" in capsys.readouterr().err
    assert sorted(p.name for p in repo.iterdir()) == ["blobs"]  # nothing written
    # a store where it belongs, whose digest file is a link to a file the checkpoint's writer owns
    store = tmp_path / "store"
    assert main(["plan", str(ckpt_copy), "--tp", "1", "--write", "--digest-store", str(store)]) == 0
    (digests,) = store.glob("*.json")
    planted = ckpt_copy / "digests.json"
    planted.write_bytes(digests.read_bytes())
    digests.unlink()
    digests.symlink_to(planted)
    capsys.readouterr()
    with pytest.raises(LoadError, match=f"{digests}: the digest file is a symlink \\(to {planted}"):
        DigestStore(store).read(digests.stem)
    argv = [str(ckpt_copy), "--no-progress", "--verify", "digest", "--digest-store", str(store)]
    assert main(argv) == 1
    assert "the digest file is a symlink" in capsys.readouterr().err

"""The manifest pins the JSON files that shape a plan (config.json, hf_quant_config.json, the
index): each reader checks them before believing a byte; an old manifest without pins still loads,
with a note."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import tpload
from tpload.loading.pick import choose, model_config
from tpload.model.errors import CheckpointError, LoadError
from tpload.model.values import INDEX_NAME, MANIFEST_NAME
from tpload.storage.catalogue import read_native
from tpload.tools.offline import verify_checkpoint, write_manifest
from tpload.tools.published import write_published


def unpin(root: Path) -> Path:
    """``root``'s manifest as a tpload before pins wrote it: no ``"files"``."""
    doc = json.loads((root / MANIFEST_NAME).read_text())
    del doc["files"]
    (root / MANIFEST_NAME).write_text(json.dumps({"format": 1, **doc}, indent=1))
    return root


@pytest.fixture(scope="module")
def llama_old(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama-tiny folder with a manifest written the old way (no "files")."""
    return unpin(write_published(tmp_path_factory.mktemp("llama") / "ckpt", "llama-tiny"))


@pytest.fixture
def pinned(llama_old: Path, tmp_path: Path) -> Path:
    """A private copy whose manifest `tpload manifest --force` rewrote with pins."""
    import shutil

    root = tmp_path / "pinned"
    shutil.copytree(llama_old, root)
    write_manifest(root, force=True)
    return root


def test_tploads_own_writers_pin_what_the_load_checks(small_ckpt: Path, tmp_path: Path) -> None:
    """synth and the published presets write manifests that pin their JSON files (what `tpload
    manifest` would write), so their loads print no stale-manifest note."""
    llama = write_published(tmp_path / "llama", "llama-tiny")
    for root, pinned_names in (
        (small_ckpt, [INDEX_NAME]),
        (llama, ["config.json", INDEX_NAME]),
    ):
        doc = json.loads((root / MANIFEST_NAME).read_text())
        assert doc["files"] == {n: {"sha256": sha(root / n)} for n in pinned_names}
        assert read_native(root)[0].check_plan_files() == []
    assert not any("pins none of" in n for n in tpload.load(llama, progress=False).report.notes)


def edit(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_manifest_pins_each_plan_file_present(pinned: Path) -> None:
    doc = json.loads((pinned / MANIFEST_NAME).read_text())
    assert doc["files"] == {
        "config.json": {"sha256": sha(pinned / "config.json")},
        INDEX_NAME: {"sha256": sha(pinned / INDEX_NAME)},
    }
    assert len(doc["tensors"]) == len(read_native(pinned)[0].tensors)


def test_an_edited_config_json_is_refused_by_every_reader(pinned: Path) -> None:
    edit(pinned / "config.json", num_key_value_heads=4)
    for read in (
        lambda: model_config(pinned),
        lambda: choose("auto", pinned),
        lambda: read_native(pinned)[0].check_plan_files(),
    ):
        with pytest.raises(
            CheckpointError,
            match=r"config\.json: model config has sha256 .* but .*NATIVE_MANIFEST"
            r"\.json pins .*manifest DIR --force",
        ):
            read()
    problems = verify_checkpoint(pinned, None)
    assert len(problems) == 1 and "config.json" in problems[0]


def test_an_edited_index_is_refused_before_it_is_parsed(pinned: Path) -> None:
    edit(pinned / INDEX_NAME, metadata={"total_size": 1})  # same weight map: only the pin can tell
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: index has sha256"):
        read_native(pinned)
    assert read_native(pinned, manifest=False)[0].tensors  # writing a new manifest still reads it


def test_a_pinned_file_that_vanished_or_an_unpinned_one_that_appeared_is_refused(
    pinned: Path,
) -> None:
    (pinned / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "NVFP4"}})
    )
    with pytest.raises(
        CheckpointError, match=r"hf_quant_config\.json: ModelOpt quantization config is not pinned"
    ):
        choose("auto", pinned)
    (pinned / "hf_quant_config.json").unlink()
    (
        pinned / "config.json"
    ).unlink()  # a missing config.json would make auto read the reference layout
    with pytest.raises(
        CheckpointError, match=r"config\.json: model config is missing, but .* pins its sha256"
    ):
        choose("auto", pinned)


def test_an_old_manifest_loads_with_a_note_and_force_pins_it(
    llama_old: Path, tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "old"
    shutil.copytree(llama_old, root)
    old_sha = sha(root / MANIFEST_NAME)
    notes = tpload.load(root, progress=False, manifest_sha256=old_sha).report.notes
    note = [n for n in notes if "pins none of" in n]
    assert len(note) == 1 and "config.json" in note[0] and "manifest DIR --force" in note[0]
    assert (
        "--manifest-sha256 pins and stored predictions" in note[0]
        and "must then be renewed" in note[0]
    )
    write_manifest(root, force=True)
    assert sha(root / MANIFEST_NAME) != old_sha  # as the note said: the pin must be renewed
    with pytest.raises(
        LoadError, match="is not the pinned .* this is not the checkpoint you pinned"
    ):
        tpload.load(root, progress=False, manifest_sha256=old_sha)
    assert not any("pins none of" in n for n in tpload.load(root, progress=False).report.notes)


def test_a_folder_without_plan_files_gets_no_note(small_ckpt: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "single"
    shutil.copytree(small_ckpt, root)
    unpin(root)
    cat = read_native(root)[0]
    assert cat.check_plan_files()  # the index is not pinned by an old manifest
    write_manifest(root, force=True)
    assert read_native(root)[0].check_plan_files() == []
    (root / INDEX_NAME).unlink()  # no JSON file left to pin: no note even unpinned
    unpin(root)
    assert read_native(root)[0].check_plan_files() == []


def test_a_malformed_files_entry_is_refused(pinned: Path) -> None:
    doc = json.loads((pinned / MANIFEST_NAME).read_text())
    doc["files"]["config.json"] = {"sha256": "xyz"}
    (pinned / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(
        CheckpointError, match=r"\"files\" must map each pinned JSON file.*config\.json"
    ):
        read_native(pinned)


def test_a_checkpoint_cached_by_an_older_tpload_is_written_again(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """The built-in checkpoint's cache names its format: a folder an older tpload wrote (a manifest
    without pins, under the old name) is not reused, so its stale-manifest note goes for good."""
    from dataclasses import asdict

    from tpload.tools.synth import CACHE_FORMAT, PRESETS, cached_checkpoint

    spec = PRESETS["small"]
    old = tmp_path / ("synth-" + "-".join(f"{k}{v}" for k, v in asdict(spec).items()))
    shutil.copytree(small_ckpt, old)
    unpin(old)
    got = cached_checkpoint(spec, tmp_path)
    assert got != old and got.name == f"{old.name}-format{CACHE_FORMAT}"
    assert read_native(got)[0].check_plan_files() == []  # pinned: no note
    assert sha(got / "model-00001-of-00002.safetensors") == sha(
        small_ckpt / "model-00001-of-00002.safetensors"
    )  # the same bytes: every digest unchanged
    stamp = (got / MANIFEST_NAME).stat().st_mtime_ns
    assert cached_checkpoint(spec, tmp_path) == got  # the current format's folder is reused
    assert (got / MANIFEST_NAME).stat().st_mtime_ns == stamp


def test_the_handshake_compares_the_plan_files_as_they_were_read(tmp_path: Path) -> None:
    """What the handshake compares (storage/pins.py's plan_file_digests) is the sha256 of the bytes
    a reader used (Pins.seen), pinned or not: a file rewritten after it shaped the plan is compared
    as it was read; a file nothing read is hashed now; an absent one is ""."""
    from tpload.storage.pins import GGUF_KV, Pins, plan_file_digests

    (tmp_path / "config.json").write_text('{"num_key_value_heads": 2}')
    (tmp_path / "hf_quant_config.json").write_text("{}")
    read = hashlib.sha256(b'{"num_key_value_heads": 2}').hexdigest()
    pins = Pins(tmp_path, None, None)  # no manifest: nothing pinned, still recorded
    assert pins.read("config.json", "model config") is not None and pins.seen == {
        "config.json": read
    }
    (tmp_path / "config.json").write_text('{"num_key_value_heads": 4}')
    got = plan_file_digests(tmp_path, known=pins.seen, gguf_kv={})
    assert got == {
        "config.json": read,
        "hf_quant_config.json": hashlib.sha256(b"{}").hexdigest(),
        "model.safetensors.index.json": "",
        GGUF_KV: "",
    }
    kv = plan_file_digests(tmp_path, gguf_kv={"a.gguf": ("11", 5), "b.gguf": ("22", 7)})
    assert kv[GGUF_KV] == hashlib.sha256(b"a.gguf\t11\nb.gguf\t22\n").hexdigest()
    assert kv["config.json"] == hashlib.sha256(b'{"num_key_value_heads": 4}').hexdigest()

"""A rank's view of a `tpload export` folder: its layout only, its own file's windows, and every
disagreement between a rank file, its manifest and this load's plan listed."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tpload.loading.planner import planner_of
from tpload.model.errors import CheckpointError, LayoutError
from tpload.planning.layout import Layout
from tpload.planning.planner import RankPlan
from tpload.selection.config import load_config
from tpload.storage.open import open_storage
from tpload.storage.partitioned import PartitionedStorage, is_partitioned, rank_file
from tpload.storage.reader import Reader
from tpload.storage.sharded import ShardedStorage
from tpload.tools.export import export

from ...ckpt_tools import stored_bytes
from ...helpers import edit_json
from .shards import EVIL, EVIL_SHOWN, MANIFEST

TP, EP, WORLD = 2, 2, 4


@pytest.fixture(scope="module")
def exported(small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small checkpoint exported for tp 2 x ep 2; tests must not modify it (copy it first)."""
    out = tmp_path_factory.mktemp("export") / "tp2ep2"
    export(small_ckpt, out, Layout(TP, EP), load_config())
    return out


@pytest.fixture
def export_copy(exported: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "export"))


@pytest.fixture
def rank1(exported: Path) -> Iterator[PartitionedStorage]:
    storage = PartitionedStorage(exported, tp=TP, ep=EP, rank=1, world=WORLD)
    yield storage
    storage.close()


def plan_of(small_ckpt: Path, rank: int) -> RankPlan:
    storage = ShardedStorage(small_ckpt)
    storage.close()
    return planner_of(storage.catalogue, load_config()).plan(Layout(TP, EP), "packed", rank)


def test_an_export_folder_is_recognised(exported: Path, small_ckpt: Path) -> None:
    assert is_partitioned(exported) and not is_partitioned(small_ckpt)
    storage = open_storage(exported, tp=TP, ep=EP, rank=3, world=WORLD)
    try:
        assert isinstance(storage, PartitionedStorage) and storage.per_rank
        assert (
            storage.paths()
            == [exported / rank_file(3, WORLD)]
            == [exported / "rank-00003-of-00004.safetensors"]
        )
    finally:
        storage.close()


@pytest.mark.parametrize("tp, ep, world", [(4, 1, 4), (1, 4, 4), (2, 1, 2), (2, 2, 8)])
def test_another_layout_is_refused_naming_both(
    exported: Path, tp: int, ep: int, world: int
) -> None:
    with pytest.raises(LayoutError) as e:
        PartitionedStorage(exported, tp=tp, ep=ep, rank=0, world=world)
    msg = str(e.value)
    assert msg.startswith(
        f"{exported} is pre-partitioned for tp 2 x ep 2 (4 ranks); this load asks for "
        f"tp {tp} x ep {ep} on {world} ranks"
    )
    assert "--tp 2 --ep 2 on 4 ranks" in msg


def test_the_catalogue_is_the_source_table(rank1: PartitionedStorage, small_ckpt: Path) -> None:
    source = ShardedStorage(small_ckpt)
    source.close()
    assert (
        rank1.catalogue.tensors == source.catalogue.tensors
    )  # whole shapes: the planner cuts the same windows
    assert rank1.source == str(small_ckpt)


def test_stored_is_the_rank_files_window(rank1: PartitionedStorage, small_ckpt: Path) -> None:
    plan = plan_of(small_ckpt, 1)
    reader = Reader(rank1)
    cuts = [cut for item in plan.items for cut in item.cuts]
    assert len(cuts) == len(rank1.windows) > 10
    for cut in cuts:
        stored, rows, cols = rank1.box(cut.name, cut.view, cut.rows, cut.cols)
        assert stored == rank1.stored(cut.name) and stored.path == rank1.path
        assert (rows, cols) == ((0, cut.rows[1] - cut.rows[0]), (0, cut.cols[1] - cut.cols[0]))
        meta = rank1.catalogue.get(cut.name)
        whole = np.frombuffer(stored_bytes(small_ckpt, cut.name), dtype=np.uint8).reshape(
            meta.rows, meta.row_bytes
        )
        window = whole[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]
        got = np.empty((stored.rows, stored.row_bytes), dtype=np.uint8)
        rank1.read(stored, 0, stored.rows, got)
        assert np.array_equal(got, window), cut
        assert stored.sha256 == hashlib.sha256(window.tobytes()).hexdigest()
        for r, c, view in reader.blocks(stored, rows, cols):
            assert np.array_equal(view, window[r : r + view.shape[0], c : c + view.shape[1]])


def test_a_window_of_another_shape_is_refused(rank1: PartitionedStorage, small_ckpt: Path) -> None:
    cut = plan_of(small_ckpt, 1).items[0].weight
    with pytest.raises(CheckpointError) as e:
        rank1.box(cut.name, cut.view, (cut.rows[0], cut.rows[1] - 1), cut.cols)
    assert str(e.value).startswith(f"{rank1.path}: tensor {cut.name}: the file holds a ")
    assert "exported with another config?" in str(e.value)


def test_a_tensor_of_another_rank_is_not_in_this_file(
    rank1: PartitionedStorage, small_ckpt: Path
) -> None:
    theirs = set(plan_of(small_ckpt, 3).used_tensors) - set(plan_of(small_ckpt, 1).used_tensors)
    name = sorted(theirs)[0]  # an expert of the other expert-parallel group
    with pytest.raises(CheckpointError, match="is not in this rank's file") as e:
        rank1.stored(name)
    assert str(e.value).startswith(f"{rank1.path}: tensor {name}")


def test_header_and_manifest_disagreements_are_listed_at_once(export_copy: Path) -> None:
    def mutate(doc: dict) -> None:
        listed = doc["ranks"][0]["tensors"]
        listed["head.weight"]["shape"] = [1, 2]
        del listed["mtp.0.enorm.weight"]
        listed[EVIL] = {"dtype": "BF16", "shape": [1], "sha256": "0" * 64}
        listed["mtp.0.hnorm.weight"]["sha256"] = "abc"

    edit_json(export_copy / MANIFEST, mutate)
    with pytest.raises(CheckpointError) as e:
        PartitionedStorage(export_copy, tp=TP, ep=EP, rank=0, world=WORLD)
    msg, where = str(e.value), export_copy / rank_file(0, WORLD)
    assert msg.startswith(f"4 disagreements between {where} and its manifest")
    assert (
        f"{where}: tensor {EVIL_SHOWN} is in the manifest's list for this file but not in the file"
        in msg
    )
    assert "\x1b" not in msg
    assert f"{where}: tensor mtp.0.enorm.weight is in the file but not in the manifest" in msg
    assert (
        f"{where}: tensor head.weight: header says BF16 [256, 256], manifest says BF16 [1, 2]"
        in msg
    )
    assert f"{where}: tensor mtp.0.hnorm.weight: manifest sha256 is not 64 hex digits" in msg
    PartitionedStorage(
        export_copy, tp=TP, ep=EP, rank=1, world=WORLD
    ).close()  # another rank's file is sound


def test_manifest_problems_report_a_plan_that_does_not_match(
    rank1: PartitionedStorage, small_ckpt: Path
) -> None:
    names = list(plan_of(small_ckpt, 1).used_tensors)
    assert rank1.manifest_problems(names) == []
    held = names.pop(0)
    names.append("mtp.0.not.planned")
    [problem] = rank1.manifest_problems(names)
    assert problem.startswith(
        f"{rank1.path} does not match this load's plan: missing mtp.0.not.planned; "
        f"not planned {held} (load it with the config"
    )


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("dtype", ["BF16"], "source entry for head.weight is not {file, dtype, shape}"),
        ("shape", [True, 256], "source entry for head.weight is not {file, dtype, shape}"),
        ("shape", [10**1000] * 8, "source entry for head.weight is not {file, dtype, shape}"),
        ("file", 5, "source entry for head.weight is not {file, dtype, shape}"),
    ],
)
def test_a_bad_source_table_entry_is_named(
    export_copy: Path, field: str, value: object, needle: str
) -> None:
    edit_json(
        export_copy / MANIFEST, lambda doc: doc["tensors"]["head.weight"].__setitem__(field, value)
    )
    with pytest.raises(CheckpointError) as e:
        PartitionedStorage(export_copy, tp=TP, ep=EP, rank=0, world=WORLD)
    assert str(e.value) == f"{export_copy / MANIFEST}: {needle}"


def test_an_export_without_its_manifest_is_refused(export_copy: Path) -> None:
    (export_copy / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="a pre-partitioned checkpoint needs its manifest"):
        PartitionedStorage(export_copy, tp=TP, ep=EP, rank=0, world=WORLD)


def test_a_manifest_that_is_no_export_manifest(export_copy: Path) -> None:
    (export_copy / MANIFEST).write_text(json.dumps({"format": 1, "tensors": {}}))
    with pytest.raises(CheckpointError, match="not a tpload export manifest"):
        PartitionedStorage(export_copy, tp=TP, ep=EP, rank=0, world=WORLD)


def test_a_rank_file_listed_under_another_name(export_copy: Path) -> None:
    edit_json(
        export_copy / MANIFEST, lambda doc: doc["ranks"][2].__setitem__("file", "../x.safetensors")
    )
    with pytest.raises(
        CheckpointError,
        match="rank 2's file is listed as '../x.safetensors', expected "
        "rank-00002-of-00004.safetensors",
    ):
        PartitionedStorage(export_copy, tp=TP, ep=EP, rank=2, world=WORLD)


def test_a_rank_file_rewritten_while_open_is_reported(export_copy: Path) -> None:
    storage = PartitionedStorage(export_copy, tp=TP, ep=EP, rank=0, world=WORLD)
    try:
        stored = storage.stored("head.weight")
        storage.read(stored, 0, 1, np.empty((1, stored.row_bytes), dtype=np.uint8))
        with open(storage.path, "ab") as f:
            f.write(b"x")
        [problem] = storage.changed()
        assert problem.startswith(f"{storage.path}: it changed while it was loaded")
    finally:
        storage.close()


def test_an_exports_config_json_is_pinned_by_its_manifest(tmp_path: Path) -> None:
    # the export copies config.json (checked against the source's pins) and pins its own copy:
    # an edit afterwards is refused by the reader, before it shapes a plan
    from tpload.loading.pick import choose, model_config
    from tpload.storage.pins import Pins
    from tpload.tools.published import write_published

    src = write_published(tmp_path / "src", "llama-tiny")
    out = tmp_path / "out"
    config, _ = choose("auto", src)
    export(src, out, Layout(1, 1), config)
    doc = json.loads((out / "NATIVE_MANIFEST.json").read_text())
    want = hashlib.sha256((src / "config.json").read_bytes()).hexdigest()
    assert doc["files"] == {"config.json": {"sha256": want}}
    assert model_config(out) == json.loads((src / "config.json").read_text())
    edit_json(out / "config.json", lambda c: c.update(num_key_value_heads=1))
    with pytest.raises(CheckpointError, match="config.json: model config has sha256 .* pins"):
        model_config(out, pins=Pins.of(out))


def test_an_export_records_its_rules_sha256_and_a_load_refuses_other_rules(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """Exported with a TOML named by its path, which is then edited (a rows rule made cols):
    before, the export recorded the path only, and a load planned by the edited rules served
    rows windows' bytes under cols windows' shapes."""
    from importlib import resources

    import tpload
    from tpload.selection.config import with_rules

    toml = tmp_path / "rules.toml"
    text = (resources.files("tpload.configs") / "deepseek-v4-mtp.toml").read_text()
    toml.write_text(text)
    config = load_config(str(toml))
    out = tmp_path / "out"
    export(small_ckpt, out, Layout(1, 1), config)
    meta = json.loads((out / "NATIVE_MANIFEST.json").read_text())["partitioned"]
    assert meta["config"] == str(toml) and meta["config_sha256"] == config.rules_sha256()
    assert len(meta["config_sha256"]) == 64
    tpload.load(str(out), progress=False).release()  # the same rules: loads

    toml.write_text(text.replace('split = "rows"', 'split = "cols"', 1))
    edited = load_config(str(toml)).rules_sha256()
    assert edited != config.rules_sha256()
    with pytest.raises(tpload.LoadError) as e:
        tpload.load(str(out), progress=False)
    assert (
        f"this export was made with config {toml} (rules sha256 {config.rules_sha256()[:16]}...), "
        f"but this load plans by config {toml} (rules sha256 {edited[:16]}...): the rules differ"
    ) in str(e.value), str(e.value)
    # other skip globs than the export's are other rules too
    toml.write_text(text)
    skip = with_rules(config, skip=("mtp.*",)).rules_sha256()
    with pytest.raises(tpload.LoadError, match=f"rules sha256 {skip[:16]}"):
        tpload.load(str(out), progress=False, skip=("mtp.*",))

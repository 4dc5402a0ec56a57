"""A GGUF checkpoint as tpload vouches for it, in one process: the manifest pins each file's
key-value section (head and expert counts, rope settings, the tokenizer) as stored, checked before
the plan; a ``.gguf`` file names its checkpoint (its folder vouching, limited to that file or split
set: a sibling set is never mixed in); every message names where the architecture and the head
counts came from (the header's keys, not a config.json that is not there).

The key-value section's extent is taken from the ``gguf`` package's own reader (the independent
reference), not from tpload's."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest

import tpload
from tpload.cli import main
from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.model.errors import CheckpointError, ConfigError, LoadError
from tpload.model.values import MANIFEST_NAME
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.storage.gguf import read_header
from tpload.storage.hub import to_hub_cache
from tpload.tools.offline import verify_checkpoint, write_manifest
from tpload.tools.synth_gguf import write_gguf_preset

gguf = pytest.importorskip("gguf")

PRESET = "qwen3-moe-gguf-tiny"
PART1, PART2 = "model-00001-of-00002.gguf", "model-00002-of-00002.gguf"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen3-MoE GGUF miniature (a split set of 2) with a manifest written by tpload."""
    root = write_gguf_preset(tmp_path_factory.mktemp("gguf") / "qwen", PRESET)
    write_manifest(root)
    return root


@pytest.fixture
def copy(qwen: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(qwen, tmp_path / "qwen"))


def kv_end(path: Path) -> int:
    """Where the key-value pairs end, by the gguf package's reader: past its last field."""
    fields = gguf.GGUFReader(path).fields.values()
    return max(f.offset + sum(p.nbytes for p in f.parts) for f in fields)


def set_u32(path: Path, key: str, value: int) -> None:
    """Overwrite a uint32 key-value in place (the file's size and every offset unchanged)."""
    raw = bytearray(path.read_bytes())
    name = key.encode()
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    assert struct.unpack_from("<I", raw, at)[0] == 4  # GGUF's uint32 value type
    struct.pack_into("<I", raw, at + 4, value)
    path.write_bytes(bytes(raw))


def minimal(path: Path, arch: str, kv: dict[str, int]) -> Path:
    """One tiny GGUF file: ``arch`` with these uint32 key-values and one F32 tensor."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch)
    for key, value in kv.items():
        w.add_uint32(key, value)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- the pin


def test_the_manifest_pins_each_files_key_values_as_stored(qwen: Path) -> None:
    doc = json.loads((qwen / MANIFEST_NAME).read_text())
    assert doc["files"] == {}  # no JSON file in a GGUF folder
    want = {}
    for name in (PART1, PART2):
        raw = (qwen / name).read_bytes()[: kv_end(qwen / name)]
        want[name] = {"sha256": hashlib.sha256(raw).hexdigest()}
    assert doc["gguf_kv"] == want


def test_an_edited_head_count_is_refused_before_the_plan(copy: Path) -> None:
    """Not a tensor byte changes: only the pin can tell (the head count decides every rank's
    window of attn_q, attn_k, attn_v and attn_output)."""
    part = copy / PART1
    set_u32(part, "qwen3moe.attention.head_count", 2)
    with pytest.raises(LoadError) as e:
        tpload.load(copy, progress=False)
    message = str(e.value)
    assert (
        f"{part}: GGUF key-values (its first {kv_end(part)} bytes) have sha256 "
        f"{hashlib.sha256(part.read_bytes()[: kv_end(part)]).hexdigest()[:16]}..., but "
        f"{copy / MANIFEST_NAME} pins "
    ) in message, message
    assert "changed after the manifest was written" in message
    assert f"`python -m tpload manifest {part} --force` pins them again" in message
    with pytest.raises(CheckpointError, match="GGUF key-values"):
        read_native(copy / PART1)  # plan, export, attest verify open it the same way
    problems = verify_checkpoint(copy, None)
    assert len(problems) == 1 and "GGUF key-values" in problems[0] and PART1 in problems[0]


def test_a_token_the_reader_does_not_keep_is_pinned_too(tmp_path: Path) -> None:
    """A tokenizer array longer than the reader keeps (it keeps only its length): the pin is of
    the bytes, so an edited token is still refused, though tpload's parse of it is the same."""
    import numpy as np

    path = tmp_path / "tok" / "m.gguf"
    path.parent.mkdir()
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)])
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_manifest(path.parent)
    before = read_header(path, path.name).kv
    raw = path.read_bytes()
    assert raw.count(b"t4321") == 1
    path.write_bytes(raw.replace(b"t4321", b"u4321"))
    assert read_header(path, path.name).kv == before  # the parse cannot see it
    with pytest.raises(CheckpointError, match=r"m\.gguf: GGUF key-values .* have sha256"):
        read_native(path.parent)


def test_an_old_manifest_without_the_pin_loads_with_a_note_and_force_pins_it(
    copy: Path,
) -> None:
    doc = json.loads((copy / MANIFEST_NAME).read_text())
    del doc["gguf_kv"]
    (copy / MANIFEST_NAME).write_text(json.dumps(doc))
    notes = tpload.load(copy, progress=False).report.notes
    note = [n for n in notes if "pins no GGUF key-values" in n]
    assert len(note) == 1, notes
    assert note[0].startswith(
        f"{MANIFEST_NAME} pins no GGUF key-values of {PART1}, {PART2} (written before tpload "
        "pinned GGUF headers)"
    )
    assert "`python -m tpload manifest DIR --force` pins them" in note[0]
    write_manifest(copy, force=True)
    assert not any("GGUF key-values" in n for n in tpload.load(copy, progress=False).report.notes)


def test_a_flipped_quant_byte_fails_the_load_naming_the_tensor_and_its_sha256(copy: Path) -> None:
    """A quant byte of expert 0's first Q4_K block changed after `tpload manifest`: the tensor's
    sha256 against the manifest catches it (the launch of this under torchrun, every rank failing,
    is the slow tier's: tests/integration/test_gguf.py)."""
    part = copy / PART2
    t = next(t for t in gguf.GGUFReader(part).tensors if t.name == "blk.1.ffn_up_exps.weight")
    start, raw = int(t.data_offset), bytearray(part.read_bytes())
    raw[start + 7] ^= 0x10
    part.write_bytes(bytes(raw))
    now = hashlib.sha256(raw[start : start + int(t.n_bytes)]).hexdigest()
    with pytest.raises(LoadError) as e:
        tpload.load(copy, progress=False)
    said = f"{part}: tensor blk.1.ffn_up_exps.weight: sha256 {now[:16]}... does not match the "
    assert said + "manifest's" in str(e.value), str(e.value)


def test_plan_and_verify_check_the_pins_before_picking_a_config_from_them(
    copy: Path, capsys: pytest.CaptureFixture
) -> None:
    """An edited architecture key (same length: every offset unchanged) would pick no shipped
    config; plan and verify name the pin it breaks instead, as the load does."""
    part = copy / PART1
    raw = part.read_bytes()
    assert raw.count(b"qwen3moe") > 1
    part.write_bytes(raw.replace(b"qwen3moe", b"qwen9moe"))  # every key and the architecture
    for argv in (["plan", str(copy), "--tp", "1"], ["verify", str(copy)]):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert "no shipped config" not in out + err, err
        assert f"{part}: GGUF key-values (its first " in err and "changed after the manifest" in err
        assert out == ""  # nothing said about a config before the pin
    with pytest.raises(LoadError, match="GGUF key-values"):
        tpload.load(copy, progress=False)


# -- where the architecture came from


def test_the_config_line_names_the_gguf_header_not_config_json(qwen: Path) -> None:
    notes = tpload.load(qwen, progress=False).report.notes
    line = next(n for n in notes if n.startswith("config "))
    assert line == (
        f"config qwen3-moe-gguf+gguf: general.architecture in the GGUF header of {PART1} is "
        "qwen3moe (gguf:qwen3moe); gguf from the GGUF header"
    )


def test_an_unknown_architecture_names_the_header_key(tmp_path: Path) -> None:
    path = minimal(tmp_path / "m" / "m.gguf", "mamba", {"mamba.block_count": 1})
    with pytest.raises(ConfigError) as e:
        choose("auto", path.parent)
    message = str(e.value)
    assert message.startswith(f"{path}: general.architecture mamba: no shipped config"), message
    assert "config.json" not in message


def test_a_missing_head_count_names_the_header_key(tmp_path: Path) -> None:
    path = minimal(tmp_path / "m" / "m.gguf", "qwen3moe", {"qwen3moe.block_count": 1})
    with pytest.raises(ConfigError) as e:
        planner_of(read_native(path.parent, manifest=False)[0], load_config("qwen3-moe-gguf"))
    message = str(e.value)
    assert (
        "counts heads by qwen3moe.attention.head_count in the GGUF header of m.gguf, which is "
        "missing (expected a positive integer)"
    ) in message, message
    assert "config.json" not in message


# -- a .gguf file names its checkpoint


def test_a_gguf_file_or_a_part_names_its_set(qwen: Path) -> None:
    whole = tpload.load(qwen, progress=False)
    want = {n: t.clone() for n, t in whole.state_dict().items()}
    digest = whole.report.mine.digest
    whole.release()
    for part in (PART1, PART2):
        shards = tpload.load(qwen / part, progress=False)
        assert shards.report.mine.digest == digest
        got = shards.state_dict()
        assert set(got) == set(want) and all(got[n].equal(want[n]) for n in want)
        shards.release()
    with pytest.raises(LoadError, match="is a file, not a checkpoint directory: give the folder"):
        tpload.load(qwen / MANIFEST_NAME, progress=False)


@pytest.fixture
def two_sets(qwen: Path, tmp_path: Path) -> Path:
    """The miniature beside another split set (seed 1, stem ``other``), each file a regular file."""
    folder = Path(shutil.copytree(qwen, tmp_path / "two"))
    (folder / MANIFEST_NAME).unlink()
    other = write_gguf_preset(tmp_path / "other", PRESET, seed=1)
    for f in other.iterdir():
        shutil.move(f, folder / f.name.replace("model", "other"))
    return folder


def test_a_sibling_set_is_never_mixed_in(qwen: Path, two_sets: Path) -> None:
    with pytest.raises(LoadError, match="split sets model, other in one folder"):
        tpload.load(two_sets, progress=False)
    write_manifest(two_sets / PART1)  # the manifest vouches for the set it was written for
    doc = json.loads((two_sets / MANIFEST_NAME).read_text())
    assert sorted(doc["gguf_kv"]) == [PART1, PART2]
    assert {e["file"] for e in doc["tensors"].values()} == {PART1, PART2}
    shards = tpload.load(two_sets / PART1, progress=False)
    reference = tpload.load(qwen, progress=False)
    assert shards.report.mine.digest == reference.report.mine.digest
    reference.release()
    shards.release()
    with pytest.raises(LoadError) as e:
        tpload.load(two_sets / "other-00001-of-00002.gguf", progress=False)
    message = str(e.value)
    assert (
        f"{two_sets}/other-00001-of-00002.gguf: GGUF key-values (its first " in message
        and f"are not pinned by {two_sets / MANIFEST_NAME}, which pins those of {PART1}, {PART2} "
        "(a manifest written for another GGUF file of this folder?)"
        in message
    ), message
    with pytest.raises(LoadError, match=f"is inside the checkpoint {two_sets}"):
        tpload.load(two_sets / PART1, progress=False, report=str(two_sets / "r.json"))
    # the subcommands see the same selection: plan and verify the set named, refuse the other
    assert main(["plan", str(two_sets / PART1), "--tp", "2"]) == 0
    assert main(["verify", str(two_sets / PART1)]) == 0
    assert main(["verify", str(two_sets / "other-00001-of-00002.gguf")]) == 1


def test_a_gguf_file_of_a_hub_snapshot_is_vouched_for_by_its_blob_alone(
    two_sets: Path, tmp_path: Path
) -> None:
    """Both sets in one snapshot (LFS blobs named by their sha256): naming one set's first part
    hashes that set's two files whole, not the sibling's, whose corrupt blob is never read."""
    snapshot = to_hub_cache(two_sets, tmp_path / "cache", "org/qwen-gguf")
    sibling = snapshot / "other-00002-of-00002.gguf"
    assert sibling.resolve().name == hashlib.sha256(sibling.read_bytes()).hexdigest()  # LFS
    blob = sibling.resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")  # the sibling, corrupt
    shards = tpload.load(snapshot / PART1, progress=False)
    note = next(n for n in shards.report.notes if n.startswith("hub cache snapshot"))
    size = sum((snapshot / p).stat().st_size for p in (PART1, PART2))
    assert note.startswith(
        f"hub cache snapshot: 2 file(s) checked whole against their blob sha256, {size / 1e9:.3f} "
        "GB hashed"
    ), note
    shards.release()
    with pytest.raises(LoadError, match="other-00002-of-00002.gguf: file sha256 .* is not"):
        tpload.load(snapshot / "other-00001-of-00002.gguf", progress=False)

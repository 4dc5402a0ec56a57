"""tpload's GGUF header reader against the ``gguf`` package (the independent reference), and hostile
headers."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest

from tpload.model.errors import CheckpointError
from tpload.storage.gguf import BLOCK, gguf_files, read_header, read_set

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

# (name, ggml type, torch-order element shape)
TENSORS = [
    ("token_embd.weight", T.Q8_0, (6, 64)),
    ("blk.0.attn_norm.weight", T.F32, (64,)),
    ("blk.0.attn_q.weight", T.F16, (8, 64)),
    ("blk.0.attn_k.weight", T.BF16, (4, 64)),
    ("blk.0.ffn_gate_exps.weight", T.Q4_K, (4, 6, 512)),
    ("blk.0.ffn_down_exps.weight", T.Q5_K, (4, 3, 256)),
    ("blk.0.ffn_up_exps.weight", T.Q3_K, (4, 6, 256)),
    ("blk.0.ffn_gate_shexp.weight", T.Q2_K, (2, 256)),
    ("output.weight", T.Q6_K, (5, 512)),
]


def _array(ttype: T, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if ttype == T.F32:
        return rng.standard_normal(shape, dtype=np.float32)
    if ttype == T.F16:
        return rng.standard_normal(shape).astype(np.float16)
    per, size = BLOCK[ttype.name]
    byte_shape = shape[:-1] + (shape[-1] // per * size,)
    return rng.integers(0, 256, byte_shape, dtype=np.uint8)


def write(
    path: Path,
    tensors: list = TENSORS,
    *,
    arch: str = "deepseek2",
    alignment: int = 0,
    split_max_tensors: int = 0,
) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    w.add_block_count(1)
    w.add_array(
        "tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)]
    )  # a long array, walked not kept
    w.add_string("general.name", "tiny")
    if alignment:
        w.add_custom_alignment(alignment)
    for name, ttype, shape in tensors:
        a = _array(ttype, shape, rng)
        if ttype in (T.F32, T.F16):
            w.add_tensor(name, a)
        else:
            w.add_tensor(
                name,
                a.view(np.uint8) if ttype == T.BF16 else a,
                raw_dtype=ttype,
                raw_shape=shape if ttype == T.BF16 else None,
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _compare(path: Path) -> None:
    ref = gguf.GGUFReader(path)
    mine = read_header(path, path.name)
    assert mine.order == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = mine.tensors[t.name]
        assert info.ggml_type == t.tensor_type.name
        assert info.elements == tuple(int(d) for d in reversed(t.shape))
        assert info.begin == t.data_offset
        assert info.nbytes == t.n_bytes
        raw = path.read_bytes()[info.begin : info.begin + info.nbytes]
        assert raw == t.data.tobytes()
        if info.dtype in BLOCK and info.dtype not in ("F32", "F16", "BF16"):
            assert info.shape == tuple(t.data.shape)  # the byte view gguf's reader gives too
        else:
            assert info.shape == info.elements
    assert mine.kv["general.architecture"] == ref.fields["general.architecture"].contents()
    assert mine.kv["deepseek2.block_count"] == 1
    assert mine.kv["tokenizer.ggml.tokens"] == 5000  # a long array kept as its length


@pytest.mark.parametrize("alignment", [0, 64, 256])
def test_matches_gguf_reader(tmp_path: Path, alignment: int) -> None:
    path = tmp_path / "m.gguf"
    write(path, alignment=alignment)
    _compare(path)
    h = read_header(path, "m.gguf")
    assert h.alignment == (alignment or 32)
    assert all((i.begin - h.data_start) % h.alignment == 0 for i in h.tensors.values())


def test_split_set(tmp_path: Path) -> None:
    write(tmp_path / "m.gguf", split_max_tensors=5)
    files = gguf_files(tmp_path)
    assert [f.name for f in files] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert gguf_files(files[1]) == files  # a part names its set
    headers = read_set(files, tmp_path)
    assert sum(len(h.tensors) for h in headers) == len(TENSORS)
    for f in files:
        _compare_set_part(f)


def _compare_set_part(path: Path) -> None:
    ref = gguf.GGUFReader(path)
    mine = read_header(path, path.name)
    assert [(t.name, t.data_offset, t.n_bytes) for t in ref.tensors] == [
        (n, mine.tensors[n].begin, mine.tensors[n].nbytes) for n in mine.order
    ]


def test_set_problems(tmp_path: Path) -> None:
    write(tmp_path / "m.gguf", split_max_tensors=3)
    files = gguf_files(tmp_path)
    assert len(files) == 3
    files[1].unlink()
    with pytest.raises(
        CheckpointError, match=r"m-00002-of-00003\.gguf: part 2 of the 3-part split set is missing"
    ):
        gguf_files(tmp_path)
    files[1].write_bytes(files[0].read_bytes())
    (tmp_path / "m-00004-of-00003.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"m-00004-of-00003\.gguf: part 4 of 3 does not fit"):
        gguf_files(tmp_path)
    (tmp_path / "m-00004-of-00003.gguf").unlink()
    (tmp_path / "m-00001-of-00004.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"does not fit the split set"):
        gguf_files(tmp_path)
    (tmp_path / "m-00001-of-00004.gguf").unlink()
    with pytest.raises(CheckpointError, match=r"m-00002-of-00003\.gguf: split\.no 0 .*disagree"):
        read_set(gguf_files(tmp_path), tmp_path)  # part 2 holds part 1's header
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(
        CheckpointError, match=r"m-00001-of-00003\.gguf: GGUF file beside safetensors shards"
    ):
        gguf_files(tmp_path)


def test_two_unsplit_files(tmp_path: Path) -> None:
    write(tmp_path / "a.gguf")
    write(tmp_path / "b.gguf")
    with pytest.raises(CheckpointError, match=r"b\.gguf: more than one GGUF checkpoint"):
        gguf_files(tmp_path)
    assert gguf_files(tmp_path / "a.gguf") == [tmp_path / "a.gguf"]


# --- hand-made headers
# ----------------------------------------------------------------------------------


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def handmade(
    tensors: list[tuple[str, tuple[int, ...], int, int]],
    data: int,
    kv: bytes = b"",
    n_kv: int = 0,
    version: int = 3,
) -> bytes:
    """A GGUF file from (name, GGUF-order dims, type id, offset) entries and ``data`` bytes of
    data."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), n_kv) + kv
    for name, dims, ttype, offset in tensors:
        head += (
            _s(name)
            + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
            + struct.pack("<IQ", ttype, offset)
        )
    head += b"\0" * (-len(head) % 32)
    return head + bytes(data)


def test_handmade_is_read(tmp_path: Path) -> None:
    path = tmp_path / "h.gguf"
    path.write_bytes(handmade([("a", (256, 2), 12, 0), ("b", (4,), 0, 288)], 320, version=2))
    h = read_header(path, "h.gguf")
    assert (
        h.version == 2
        and h.tensors["a"].shape == (2, 144)
        and h.tensors["b"].begin == h.data_start + 288
    )


@pytest.mark.parametrize(
    "entries,data,message",
    [
        ([("a", (256, 2), 12, 0), ("b", (4,), 0, 256)], 320, r"h\.gguf: tensors a and b overlap"),
        (
            [("a", (256, 2), 12, 0)],
            200,
            r"h\.gguf: tensor a: data bytes 0\.\.288 run past the end of the file",
        ),
        ([("a", (256, 2), 12, 0), ("a", (4,), 0, 288)], 320, r"h\.gguf: tensor a appears twice"),
        (
            [("a", (100, 2), 12, 0)],
            320,
            r"tensor a: Q4_K innermost dimension 100 is not a multiple of its 256-weight",
        ),
        ([("a", (64, 2), 2, 0)], 320, r"h\.gguf: tensor a: ggml type Q4_0 is not served"),
        ([("a", (64, 2), 99, 0)], 320, r"h\.gguf: tensor a: ggml type type 99 is not served"),
        (
            [("a", (4,), 0, 8)],
            320,
            r"tensor a: offset 8 is not a multiple of general\.alignment 32",
        ),
    ],
)
def test_bad_tensor_entries(tmp_path: Path, entries: list, data: int, message: str) -> None:
    path = tmp_path / "h.gguf"
    path.write_bytes(handmade(entries, data))
    with pytest.raises(CheckpointError, match=message):
        read_header(path, "h.gguf")


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"GGUX" + bytes(20), r"h\.gguf: GGUF header: magic is not GGUF"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), r"version 1 is not read"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), r"tensor count 1099511627776 is more than"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40), r"key-value count .* is more than"),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 60),
            r"key 0: string length .* is more than",
        ),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<IIQ", 9, 4, 1 << 40),
            r"key k: array length 1099511627776 is more than",
        ),
        (
            b"GGUF"
            + struct.pack("<IQQ", 3, 0, 1)
            + _s("k")
            + struct.pack("<IIQIQIQ", 9, 9, 1, 9, 1, 9, 1),
            r"key k\[0\]\[0\]: arrays nested more than 2 deep",
        ),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<I", 13),
            r"key k: value type 13 is not a GGUF",
        ),
        (
            b"GGUF"
            + struct.pack("<IQQ", 3, 0, 1)
            + _s("general.alignment")
            + struct.pack("<II", 4, 48),
            r"general\.alignment 48 is not a power of two",
        ),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + (_s("k") + struct.pack("<IB", 0, 1)) * 2,
            r"key k appears twice",
        ),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _s("t") + struct.pack("<I", 7),
            r"tensor t: 7 dimensions",
        ),
        (
            b"GGUF"
            + struct.pack("<IQQ", 3, 0, 1)
            + _s("k")
            + struct.pack("<IQ", 8, 2)
            + b"\xff\xfe",
            r"key k: not UTF-8",
        ),
    ],
)
def test_bad_headers(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "h.gguf"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match=message):
        read_header(path, "h.gguf")


def test_fuzz_one_line(tmp_path: Path) -> None:
    """Truncations and bit flips of a real header: read, or refused in one line naming the file."""
    src = tmp_path / "m.gguf"
    write(src, TENSORS[:4])
    good = src.read_bytes()
    end = read_header(src, "m.gguf").data_start
    rng = random.Random(1)
    cases = [good[:n] for n in sorted(rng.sample(range(end), 24))]
    for _ in range(48):
        b = bytearray(good)
        for _ in range(rng.choice((1, 2, 4))):
            i = rng.randrange(end)
            b[i] ^= 1 << rng.randrange(8)
        cases.append(bytes(b))
    refused = 0
    for i, raw in enumerate(cases):
        path = tmp_path / f"f{i}.gguf"
        path.write_bytes(raw)
        try:
            read_header(path, path.name)
        except CheckpointError as e:
            refused += 1
            lines = str(e).splitlines()
            assert f"f{i}.gguf" in lines[0]
            assert len(lines) == 1 or lines[0].startswith(f"{len(lines) - 1} problems")
    assert refused >= 24  # every truncation at least


def test_headers_only_full_set_for_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """deepseek-r1-gguf-full: our own header writer read back by gguf's reader; `plan` gives
    per-rank figures (the command line's entry point, in this process)."""
    from tpload.cli import main

    root = tmp_path / "r1"
    assert main(["synth", str(root), "--preset", "deepseek-r1-gguf-full", "--headers-only"]) == 0
    files = gguf_files(root)
    assert len(files) == 9
    _compare_set_part(files[0])
    headers = read_set(files, root)
    tensors = {n: h.tensors[n] for h in headers for n in h.order}
    assert len(tensors) == 1025  # as llama.cpp's DeepSeek-R1 Q4_K_M
    assert sum(t.nbytes for t in tensors.values()) == 404_424_884_224
    assert (
        tensors["blk.3.ffn_down_exps.weight"].dtype,
        tensors["blk.7.ffn_down_exps.weight"].dtype,
    ) == ("Q6_K", "Q4_K")
    assert tensors["blk.3.ffn_down_exps.weight"].elements == (256, 7168, 2048)
    capsys.readouterr()
    assert main(["plan", str(root), "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "headers-only checkpoint" in out and "51.384" in out, out

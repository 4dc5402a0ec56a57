"""The fault matrix, in-process: every bad checkpoint, option or environment ends the load with one
LoadError that names the file, tensor and rank and what was expected, and no weights. These run the
same per-rank code a torchrun launch runs (``tpload.load`` in a single process); the distributed
behaviours (consensus, a dead rank, the cross-check) are the integration tier's."""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import tpload
from tpload.model.errors import LoadError
from tpload.tools.synth import SynthSpec, write_checkpoint

from ...ckpt_tools import add_tensors, repin
from ...helpers import edit_json, poke, rewrite_header, shard_of, tensor_offset

S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
W1 = "mtp.0.ffn.experts.3.w1.weight"


def load(root: Path, **kw: object) -> tpload.RankShards:
    return tpload.load(root, progress=False, **kw)


def fails(root: Path, *needles: str, **kw: object) -> str:
    with pytest.raises(LoadError) as e:
        load(root, **kw)
    msg = str(e.value)
    assert "no rank returned weights" in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"
    return msg


def manifest(root: Path, mutate: Callable[[dict], None]) -> None:
    edit_json(root / "NATIVE_MANIFEST.json", lambda m: mutate(m["tensors"]))


def index(root: Path, mutate: Callable[[dict], None]) -> None:
    """Edit the index, then pin it again: the fault tested is the index's content, which its pin
    in the manifest would otherwise refuse first."""
    edit_json(root / "model.safetensors.index.json", lambda m: mutate(m["weight_map"]))
    repin(root)


def _truncate(root: Path) -> None:
    p = root / S2
    p.write_bytes(p.read_bytes()[:-1])


def _header_garbage(root: Path) -> None:
    raw = bytearray((root / S1).read_bytes())
    raw[8:16] = b"[{oops:!"
    (root / S1).write_bytes(bytes(raw))


def _header_length(root: Path) -> None:
    raw = (root / S1).read_bytes()
    (root / S1).write_bytes((len(raw) + 100).to_bytes(8, "little") + raw[8:])


def _overlap(h: dict) -> None:
    a, b = (
        h["mtp.0.ffn.experts.0.w1.weight"]["data_offsets"],
        h["mtp.0.ffn.experts.0.w1.scale"]["data_offsets"],
    )
    h["mtp.0.ffn.experts.0.w1.scale"]["data_offsets"] = [a[0] + 8, a[0] + 8 + b[1] - b[0]]


def _past_end(h: dict) -> None:
    last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    h[last]["data_offsets"] = [o + 64 for o in h[last]["data_offsets"]]


def _overflow_fp4(root: Path) -> None:
    # scale 254 (2^127) on a group whose codes are 6.0: 6 * 2^127 overflows bf16 (and fp32)
    poke(root, W1, 200 * 128, 0x77, fix_manifest=True)
    poke(root, "mtp.0.ffn.experts.3.w1.scale", 200 * 8, 254, fix_manifest=True)


def _overflow_fp8(root: Path) -> None:
    # E4M3 0x7E (448) under E8M0 scale 250 (2^123): 448 * 2^123 > 2^128
    poke(root, "mtp.0.ffn.shared_experts.w3.weight", 0, 0x7E, fix_manifest=True)
    poke(root, "mtp.0.ffn.shared_experts.w3.scale", 0, 250, fix_manifest=True)


FAULTS: dict[str, tuple[Callable[[Path], None], dict, tuple[str, ...]]] = {
    # a flipped bit in each kind of tensor: caught by sha256 against the manifest
    "bit-expert-weight": (lambda r: poke(r, W1, 1000), {}, (W1, "does not match the manifest", S1)),
    "bit-scale": (
        lambda r: poke(r, "mtp.0.ffn.experts.2.w2.scale", 10),
        {},
        ("mtp.0.ffn.experts.2.w2.scale", "sha256"),
    ),
    "bit-dense-fp8": (
        lambda r: poke(r, "mtp.0.ffn.shared_experts.w1.weight", 500),
        {},
        ("mtp.0.ffn.shared_experts.w1.weight", "does not match the manifest"),
    ),
    "bit-bf16-head": (
        lambda r: poke(r, "head.weight", 12345),
        {},
        ("head.weight", "does not match the manifest"),
    ),
    "bit-rank-mode": (
        lambda r: poke(r, "head.weight", 12345),
        {"verify": "rank"},
        ("head.weight", "sha256"),
    ),
    # files
    "shard-truncated": (_truncate, {}, (S2, "runs past the data")),
    "shard-missing": (lambda r: os.remove(r / S2), {}, (f"shard {S2} does not exist",)),
    "index-names-missing-file": (
        lambda r: index(r, lambda m: m.update({"head.weight": "model-00009.safetensors"})),
        {},
        ("shard model-00009.safetensors does not exist",),
    ),
    "index-leaves-a-tensor-out": (
        lambda r: index(r, lambda m: m.pop("head.weight")),
        {},
        (
            "1 tensor(s) in the header of model-00002-of-00002.safetensors are not mapped to it "
            "by the index",
            "head.weight",
        ),
    ),
    "index-leaves-an-expert-out": (
        lambda r: index(r, lambda m: m.pop(W1)),
        {"verify": "off"},
        (W1, "not mapped"),
    ),
    "index-value-not-a-string": (
        lambda r: index(r, lambda m: m.update({"head.weight": 5})),
        {},
        ("weight_map values must be file names", "head.weight"),
    ),
    # headers
    "header-not-json": (_header_garbage, {}, (S1, "header is not readable JSON")),
    "header-length-past-file": (_header_length, {}, (S1, "runs past the file")),
    "offsets-overlap": (lambda r: rewrite_header(r, S1, _overlap), {}, (S1, "overlap")),
    "offsets-past-end": (
        lambda r: rewrite_header(r, S2, _past_end),
        {},
        (S2, "runs past the data"),
    ),
    "offsets-vs-dtype-shape": (
        lambda r: rewrite_header(r, S1, lambda h: h[W1.replace("3", "0")].update(shape=[256, 129])),
        {},
        ("mtp.0.ffn.experts.0.w1.weight", "I8 x [256, 129] is 33024"),
    ),
    "dtype-not-a-string": (
        lambda r: rewrite_header(r, S1, lambda h: h[W1].update(dtype=5)),
        {},
        (W1, "dtype 5"),
    ),
    "shape-dim-a-bool": (
        lambda r: rewrite_header(r, S1, lambda h: h[W1].update(shape=[True, 128])),
        {},
        (W1, "is not a list of non-negative integers"),
    ),
    "shape-overflows": (
        lambda r: rewrite_header(r, S1, lambda h: h[W1].update(shape=[2**62, 2**62])),
        {},
        (W1, "is not a list of non-negative integers"),
    ),
    # manifest
    "manifest-missing-tensor": (
        lambda r: manifest(r, lambda t: t.pop("mtp.0.ffn.gate.bias")),
        {},
        ("mtp.0.ffn.gate.bias", "not in the manifest"),
    ),
    "manifest-orphan-entry": (
        lambda r: manifest(r, lambda t: t.update({"mtp.0.extra.weight": t["head.weight"]})),
        {},
        ("the manifest lists 1 tensor(s) no shard holds", "mtp.0.extra.weight"),
    ),
    "manifest-shape-disagrees": (
        lambda r: manifest(r, lambda t: t["head.weight"].update(shape=[1, 2])),
        {},
        ("head.weight: manifest says", "[1, 2]", "shard header says"),
    ),
    "manifest-not-json": (
        lambda r: (r / "NATIVE_MANIFEST.json").write_text("{oops"),
        {},
        ("manifest is not readable JSON",),
    ),
    "manifest-infinity-shape": (
        lambda r: (r / "NATIVE_MANIFEST.json").write_text(
            (r / "NATIVE_MANIFEST.json")
            .read_text()
            .replace('"shape": [\n    512', '"shape": [\n    Infinity', 1)
        ),
        {},
        ("NATIVE_MANIFEST.json", "Infinity is not a JSON number"),
    ),
    "manifest-absent": (
        lambda r: os.remove(r / "NATIVE_MANIFEST.json"),
        {},
        ("manifest missing", "tpload manifest", "--verify off"),
    ),
    # values (the manifest re-hashed, so only the value checks can catch them)
    "scale-0x00": (
        lambda r: poke(r, "mtp.0.ffn.experts.1.w3.scale", 200 * 8 + 3, 0x00, fix_manifest=True),
        {},
        ("tensor mtp.0.ffn.experts.1.w3.scale", "1 E8M0 scale bytes 0x00/0xFF", "rank 0:"),
    ),
    "scale-0xFF-expanded": (
        lambda r: poke(r, "mtp.0.ffn.experts.1.w3.scale", 200 * 8 + 3, 0xFF, fix_manifest=True),
        {"kind": "expanded"},
        ("mtp.0.ffn.experts.1.w3", "E8M0 scale bytes 0x00/0xFF"),
    ),
    "fp8-nan-code": (
        lambda r: poke(r, "mtp.0.ffn.shared_experts.w3.weight", 200 * 256, 0x7F, fix_manifest=True),
        {},
        ("mtp.0.ffn.shared_experts.w3.weight", "1 E4M3 NaN codes"),
    ),
    "overflow-fp4-expanded": (
        _overflow_fp4,
        {"kind": "expanded"},
        (W1, "overflows bf16", "row 200"),
    ),
    "overflow-fp4-packed": (
        _overflow_fp4,
        {},
        (
            W1,
            "1 32-element groups whose decode overflows bf16",
            "first: row 200, elements 0..31, scale byte 254",
        ),
    ),
    "overflow-fp8-packed": (
        _overflow_fp8,
        {},
        ("mtp.0.ffn.shared_experts.w3.weight", "overflows bf16", "row 0"),
    ),
    # paths out of the folder
    "index-dotdot": (
        lambda r: index(r, lambda m: m.update({"head.weight": "../x.safetensors"})),
        {},
        ("'../x.safetensors' points outside the checkpoint folder",),
    ),
    "index-absolute": (
        lambda r: index(r, lambda m: m.update({"head.weight": "/etc/passwd"})),
        {},
        ("'/etc/passwd' points outside the checkpoint folder",),
    ),
    # layouts and configs
    "tp-vs-world": (
        lambda r: None,
        {"tp": 4},
        (
            "tp 4 x ep 1 = 4 ranks, but the group has 1",
            "launch 4 ranks for it (torchrun --nproc-per-node 4)",
            "--tp 1 --ep 1",
        ),
    ),
    "config-misses-tensors": (
        lambda r: (r / "c.toml").write_text('[[rules]]\nmatch = "mtp.*"\nrole = "plain"\n'),
        {"config": "CKPT/c.toml"},
        ("1 tensor matches no rule", "head.weight"),
    ),
    "checkpoint-missing": (
        lambda r: os.rename(r, r.with_name("gone")),
        {},
        ("checkpoint directory does not exist",),
    ),
}


LAUNCHED = {"tp-vs-world"}
"""Faults of a process torchrun started as a world of 1 (one started by no launcher is told to
launch the ranks before anything: tests/unit/model/test_text.py)."""


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_fails_with_one_message(
    fault: str, ckpt_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fault in LAUNCHED:
        monkeypatch.setenv("WORLD_SIZE", "1")
    mutate, kw, needles = FAULTS[fault]
    mutate(ckpt_copy)
    kw = {k: v.replace("CKPT", str(ckpt_copy)) if isinstance(v, str) else v for k, v in kw.items()}
    fails(ckpt_copy, *needles, **kw)


def test_every_bad_shard_is_listed_at_once(ckpt_copy: Path) -> None:
    _header_garbage(ckpt_copy)
    _truncate(ckpt_copy)
    fails(ckpt_copy, S1, S2, "header is not readable JSON", "runs past the data")


def test_a_checkpoint_given_as_a_file_says_so(ckpt_copy: Path) -> None:
    fails(ckpt_copy / S1, "is a file, not a checkpoint directory")


def _blocks_forever_without_a_bound(root: Path, **kw: object) -> str:
    """The load in a thread, so a hang fails the test instead of the suite."""
    out: dict[str, str] = {}

    def go() -> None:
        try:
            load(root, **kw)
            out["msg"] = "loaded"
        except LoadError as e:
            out["msg"] = str(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the load blocked"
    return out["msg"]


@pytest.mark.parametrize("which", [S2, "model.safetensors.index.json", "NATIVE_MANIFEST.json"])
def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(ckpt_copy: Path, which: str) -> None:
    (ckpt_copy / which).unlink()
    os.mkfifo(ckpt_copy / which)
    msg = _blocks_forever_without_a_bound(ckpt_copy)
    assert f"{which}: " in msg and "is a FIFO; refused" in msg


class AfterFirst:
    """A progress sink that does something to the files once the first tensor is loaded."""

    def __init__(self, act: Callable[[], None]) -> None:
        self.act, self.done = act, False

    def update(self, nbytes: int) -> None:
        if not self.done:
            self.done = True
            self.act()

    def close(self) -> None:
        pass


def test_a_shard_truncated_while_loading_names_the_file(ckpt_copy: Path) -> None:
    # head.weight comes first (natural order) from shard 2; shard 1 is then cut short
    path = ckpt_copy / S1
    sink = AfterFirst(lambda: os.truncate(path, path.stat().st_size // 2))
    with pytest.raises(LoadError) as e:
        load(ckpt_copy, progress_sink=sink)
    msg = str(e.value)
    assert (
        f"{path}: tensor " in msg
        and "file ends at byte" in msg
        and "truncated while it was read?" in msg
    )


def test_a_shard_rewritten_while_loading_fails_the_load(ckpt_copy: Path) -> None:
    path = ckpt_copy / S2  # head.weight's shard, already read when it changes
    sink = AfterFirst(
        lambda: path.write_bytes(path.read_bytes())
    )  # same bytes, but a new file version
    fails(ckpt_copy, f"{path}: it changed while it was loaded", progress_sink=sink, verify="off")


def test_a_shard_bigger_than_memory_costs_only_its_windows(tmp_path: Path) -> None:
    # a 1 TiB sparse shard (its big tensor skipped): nothing maps it, only the small tensor is read
    root = tmp_path / "big"
    root.mkdir()
    header = {
        "small": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "huge": {"dtype": "U8", "shape": [1 << 40], "data_offsets": [8, 8 + (1 << 40)]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(root / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"\x01\x00" * 4)
        f.truncate(8 + len(raw) + 8 + (1 << 40))
    (root / "c.toml").write_text(
        '[[rules]]\nmatch = "huge"\nrole = "skip"\n[[rules]]\nmatch = "*"\nrole = "plain"\n'
    )
    shards = load(root, config=str(root / "c.toml"), verify="off")
    assert shards.state_dict()["small"].view(torch.int16).tolist() == [1, 1, 1, 1]


def test_names_with_control_characters_are_escaped_everywhere(ckpt_copy: Path) -> None:
    add_tensors(
        ckpt_copy, {"extra.\x1b[2Jok": torch.ones(4, dtype=torch.bfloat16)}, manifest="wrong"
    )
    msg = fails(ckpt_copy, "extra.\\x1b[2Jok")
    assert "\x1b" not in msg
    shards = load(ckpt_copy, verify="off")
    assert "\x1b" not in shards.report.table() and "extra.\x1b[2Jok" in shards.state_dict()


def test_bad_options_are_load_errors_before_any_byte(small_ckpt: Path) -> None:
    fails(
        small_ckpt,
        "invalid option: timeout_s= must be a finite number > 0 and at most 604800 (7 days), got "
        "nan",
        timeout_s=float("nan"),
    )
    fails(small_ckpt, "device 'meta'", device="meta")
    with pytest.raises(LoadError, match="unknown option 'tensor_parallel'"):
        load(small_ckpt, tensor_parallel=2)


def test_an_unwritable_home_gives_a_message_for_the_builtin_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a home under a plain file: no folder can be made there, whoever runs the test (root included)
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.delenv("TPLOAD_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))
    from tpload.tools.synth import resolve_checkpoint

    with pytest.raises(
        LoadError, match="cannot write the built-in checkpoint under .*set TPLOAD_CACHE"
    ):
        resolve_checkpoint(None)


def test_the_library_never_writes_the_builtin_checkpoint() -> None:
    # only the command line writes and loads it; load() without a checkpoint names the keyword
    with pytest.raises(LoadError, match="checkpoint: load\\(\\) needs a checkpoint folder"):
        load(None)


def test_an_empty_cache_variable_does_not_write_into_the_working_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tpload.tools.synth import cache_root

    monkeypatch.delenv("TPLOAD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "tpload"


def test_synth_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(LoadError, match="not an empty folder"):
        write_checkpoint(tmp_path, SynthSpec())
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_load_twice_then_release_and_the_released_shards_refuse(small_ckpt: Path) -> None:
    a, b = load(small_ckpt), load(small_ckpt)
    assert a.report.mine.digest == b.report.mine.digest
    a.release()
    with pytest.raises(LoadError, match="released"):
        a.state_dict()
    assert b.state_dict()


def test_a_world_that_cannot_form_fails_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch, small_ckpt: Path
) -> None:
    from ...helpers import free_port

    for k, v in {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # as under torchrun, whose agent holds the store
    }.items():
        monkeypatch.setenv(k, v)
    # 1 s proves the bound as well as any: the store's client retries until it runs out
    with pytest.raises(LoadError, match="could not form the process group of 2 ranks within 1 s"):
        load(small_ckpt, timeout_s=1.0)


def test_sigterm_says_what_stopped_the_rank() -> None:
    from tpload.cli.load import on_sigterm

    with pytest.raises(
        LoadError, match="stopped by signal SIGTERM .* or when it is stopped itself"
    ):
        on_sigterm(signal.SIGTERM, None)


def test_offsets_are_read_through_the_header_not_the_index(ckpt_copy: Path) -> None:
    # the index maps head.weight to shard 1, whose header has no such tensor
    index(ckpt_copy, lambda m: m.update({"head.weight": S1}))
    fails(
        ckpt_copy,
        "tensor head.weight is mapped to model-00001-of-00002.safetensors but its header has no "
        "such tensor",
    )
    assert tensor_offset  # the helper reads headers independently of tpload
    assert shard_of(ckpt_copy, "head.weight") == S1


def test_a_wrong_decode_is_caught_by_the_independent_reference(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpload.codecs.fp4_e8m0 import FP4E8M0

    real = FP4E8M0.decode

    def off_by_one(
        self, weight, scale, out, fit, **kw
    ):  # a decoder bug in the last row of every window
        real(self, weight, scale, out, fit, **kw)
        out[-1, 0] = out[-1, 0] + 1

    monkeypatch.setattr(FP4E8M0, "decode", off_by_one)
    msg = fails(
        small_ckpt,
        "1 decoded rows that differ from an independent decode (rows 0..31, 224..255)",
        kind="expanded",
        samples=2,
    )
    assert "mtp.0.ffn.experts.0.w1.weight" in msg

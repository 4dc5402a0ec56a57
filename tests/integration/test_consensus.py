"""The fault matrix: each fault really runs torchrun on 2 ranks and must end every rank
non-zero, with the same message naming file/tensor/rank and the problem, within a bound,
and with no weights handed to an embedding caller."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tpload.synth import SynthSpec, write_checkpoint

from .helpers import HERE, edit_json, error_of, poke, rewrite_header, tpload_cli, torchrun

BOUND_S = 60
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
W1 = "mtp.0.ffn.experts.3.w1.weight"  # rows 128.. of a w1 are tp rank 1's half


def assert_failed_everywhere(run, *needles: str) -> str:
    assert run.rc != 0, run.text
    assert run.seconds < BOUND_S, run.seconds
    msgs = [error_of(run.rank_err[r], r) for r in sorted(run.rank_err)]
    assert len(msgs) == 2 and all(msgs), run.text
    assert msgs[0] == msgs[1], msgs  # the same message on every rank
    for needle in needles:
        assert needle in msgs[0], f"{needle!r} not in: {msgs[0]}"
    assert "no rank returned weights" in msgs[0]
    return msgs[0]


def manifest(root: Path, mutate: Callable[[dict], None]) -> None:
    edit_json(root / "NATIVE_MANIFEST.json", lambda m: mutate(m["tensors"]))


def index(root: Path, mutate: Callable[[dict], None]) -> None:
    edit_json(root / "model.safetensors.index.json", lambda m: mutate(m["weight_map"]))


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
    a, b = h["mtp.0.ffn.experts.0.w1.weight"]["data_offsets"], h["mtp.0.ffn.experts.0.w1.scale"]["data_offsets"]
    size = b[1] - b[0]
    h["mtp.0.ffn.experts.0.w1.scale"]["data_offsets"] = [a[0] + 8, a[0] + 8 + size]


def _past_end(h: dict) -> None:
    last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    h[last]["data_offsets"] = [o + 64 for o in h[last]["data_offsets"]]


def _shape_disagrees(h: dict) -> None:
    h["mtp.0.ffn.experts.0.w1.weight"]["shape"] = [256, 129]


def _overflow(root: Path) -> None:
    # scale 254 (2^127) on a group whose codes are 6.0: 6 * 2^127 overflows bf16 (and fp32)
    poke(root, W1, 200 * 128, 0x77, fix_manifest=True)
    poke(root, "mtp.0.ffn.experts.3.w1.scale", 200 * 8, 254, fix_manifest=True)


FAULTS: dict[str, tuple[Callable[[Path], None], tuple[str, ...], tuple[str, ...]]] = {
    # 1. a flipped bit in each kind of tensor: caught by sha256 against the manifest
    "bit-expert-weight": (lambda r: poke(r, W1, 1000), (), (W1, "does not match the manifest", S1)),
    "bit-scale": (lambda r: poke(r, "mtp.0.ffn.experts.2.w2.scale", 10), (), ("mtp.0.ffn.experts.2.w2.scale", "sha256")),
    "bit-dense-fp8": (lambda r: poke(r, "mtp.0.ffn.shared_experts.w1.weight", 500), (),
                      ("mtp.0.ffn.shared_experts.w1.weight", "does not match the manifest")),
    "bit-bf16-head": (lambda r: poke(r, "head.weight", 12345), (), ("head.weight", "does not match the manifest")),
    # 2. files
    "shard-truncated": (_truncate, (), (S2, "runs past the data")),
    "shard-missing": (lambda r: os.remove(r / S2), (), (f"shard {S2} does not exist",)),
    "index-names-missing-file": (lambda r: index(r, lambda m: m.update({"head.weight": "model-00009.safetensors"})), (),
                                 ("shard model-00009.safetensors does not exist",)),
    # 3. headers
    "header-not-json": (_header_garbage, (), (S1, "header is not JSON")),
    "header-length-past-file": (_header_length, (), (S1, "runs past the file")),
    "offsets-overlap": (lambda r: rewrite_header(r, S1, _overlap), (), (S1, "overlap")),
    "offsets-past-end": (lambda r: rewrite_header(r, S2, _past_end), (), (S2, "runs past the data")),
    "offsets-vs-dtype-shape": (lambda r: rewrite_header(r, S1, _shape_disagrees), (),
                               ("mtp.0.ffn.experts.0.w1.weight", "I8 x [256, 129] is 33024")),
    # 4. manifest
    "manifest-missing-tensor": (lambda r: manifest(r, lambda t: t.pop("mtp.0.ffn.gate.bias")), (),
                                ("mtp.0.ffn.gate.bias", "not in the manifest")),
    "manifest-shape-disagrees": (lambda r: manifest(r, lambda t: t["head.weight"].update(shape=[1, 2])), (),
                                 ("head.weight: manifest says", "[1, 2]", "shard header says")),
    "manifest-not-json": (lambda r: (r / "NATIVE_MANIFEST.json").write_text("{oops"), (), ("manifest is not readable JSON",)),
    "manifest-absent": (lambda r: os.remove(r / "NATIVE_MANIFEST.json"), (), ("manifest missing", "--verify off")),
    # 5. values (the manifest re-hashed, so only the value checks can catch them)
    "scale-0x00": (lambda r: poke(r, "mtp.0.ffn.experts.1.w3.scale", 200 * 8 + 3, 0x00, fix_manifest=True), (),
                   ("mtp.0.ffn.experts.1.w3.scale", "E8M0 scale bytes 0x00/0xFF", "rank 1:")),
    "scale-0xFF": (lambda r: poke(r, "mtp.0.ffn.experts.1.w3.scale", 200 * 8 + 3, 0xFF, fix_manifest=True),
                   ("--kind", "expanded"), ("mtp.0.ffn.experts.1.w3", "E8M0 scale bytes 0x00/0xFF", "rank 1:")),
    "fp8-nan-code": (lambda r: poke(r, "mtp.0.ffn.shared_experts.w3.weight", 200 * 256, 0x7F, fix_manifest=True), (),
                     ("mtp.0.ffn.shared_experts.w3.weight", "E4M3 NaN codes", "rank 1:")),
    "decode-overflows-bf16": (_overflow, ("--kind", "expanded"), (W1, "not finite", "rank 1:")),
    # 6. paths out of the folder
    "index-dotdot": (lambda r: index(r, lambda m: m.update({"head.weight": "../x.safetensors"})), (),
                     ("'../x.safetensors' points outside the checkpoint folder",)),
    "index-absolute": (lambda r: index(r, lambda m: m.update({"head.weight": "/etc/passwd"})), (),
                       ("'/etc/passwd' points outside the checkpoint folder",)),
    # 8. layouts
    "tp-vs-world": (lambda r: None, ("--tp", "4"), ("tp 4 x ep 1 = 4 ranks, but the group has 2", "--tp 2 --ep 1")),
    # more a serving engineer fears
    "config-misses-tensors": (lambda r: (r / "c.toml").write_text('[[rules]]\nmatch = "mtp.*"\nrole = "plain"\n'),
                              ("--config", "CKPT/c.toml"), ("match no rule", "head.weight")),
    "checkpoint-missing": (lambda r: os.rename(r, r.with_name("gone")), (), ("checkpoint directory does not exist",)),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_fails_every_rank_with_one_message(fault: str, ckpt_copy: Path, tmp_path: Path) -> None:
    mutate, flags, needles = FAULTS[fault]
    mutate(ckpt_copy)
    flags = tuple(f.replace("CKPT", str(ckpt_copy)) for f in flags)
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), *flags, logs=tmp_path / "logs")
    assert_failed_everywhere(run, *needles)


def test_every_bad_shard_is_listed_at_once(ckpt_copy: Path, tmp_path: Path) -> None:
    _header_garbage(ckpt_copy)
    _truncate(ckpt_copy)
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), logs=tmp_path / "logs")
    assert_failed_everywhere(run, S1, S2, "header is not JSON", "runs past the data")


def test_impossible_tp_says_which_layouts_work(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "c", SynthSpec(inter=192, experts=4))
    run = tpload_cli(2, "--checkpoint", str(root), logs=tmp_path / "logs")
    assert_failed_everywhere(run, "192 channels / tp 2 = 96, not a multiple of 64", "--tp 1 --ep 2")


def test_digest_differing_from_the_stored_prediction(ckpt_copy: Path, tmp_path: Path) -> None:
    import subprocess
    import sys
    subprocess.run([sys.executable, "-m", "tpload", "plan", str(ckpt_copy), "--tp", "2", "--write"], check=True,
                   capture_output=True)
    edit_json(ckpt_copy / "TPLOAD_DIGESTS.json",
              lambda d: [v["digests"].__setitem__(1, "0" * 64) for v in d["layouts"].values()])
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), logs=tmp_path / "logs")
    assert run.rc != 0
    msgs = [error_of(run.rank_err[r], r) for r in (0, 1)]
    assert msgs[0] == msgs[1] and "rank 1: digest" in msgs[0] and "differs from the prediction" in msgs[0]
    assert "rank 0: digest" not in msgs[0]


def test_a_killed_rank_is_named_and_nobody_hangs(small_ckpt: Path, tmp_path: Path) -> None:
    run = tpload_cli(2, "--checkpoint", str(small_ckpt), "--verify", "rank", logs=tmp_path / "logs",
                     env={"TPLOAD_TEST_KILL": "1:3"})
    assert run.rc != 0 and run.seconds < BOUND_S
    assert "SIGKILL" in run.err or "-9" in run.err  # torchrun saw rank 1 die
    msg = error_of(run.rank_err[0], 0)
    assert "rank 1 never reached it" in msg or "stopped by signal SIGTERM" in msg, run.rank_err[0]
    assert error_of(run.rank_err[1], 1) == ""  # the killed rank printed nothing


def test_no_weights_reach_an_embedding_caller(ckpt_copy: Path, tmp_path: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.6.w2.weight", 77)
    run = torchrun(2, [str(HERE / "workers" / "embed.py"), str(ckpt_copy), str(tmp_path)])
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(o["returned"] is False for o in outcomes), outcomes
    assert outcomes[0]["error"] == outcomes[1]["error"] and "mtp.0.ffn.experts.6.w2.weight" in outcomes[0]["error"]

"""Skip and defer rules: skipped tensors are neither read nor hashed, deferred ones are not uploaded
but located (and not hashed), and the report counts both. Which ep group locates which deferred
expert is a plan property (test_plan.py)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

import tpload
from tpload.loading.deferred import DeferredTensor
from tpload.model.errors import CheckpointError, LoadError

from ...ckpt_tools import add_tensors, all_names, config_with, nbytes, stored_bytes
from ...helpers import poke, tensor_offset

EXPERTS = 8


def load(root: Path, **kw: object) -> tpload.RankShards:
    return tpload.load(root, progress=False, **kw)


def test_skip_mtp_reads_and_hashes_only_the_head(ckpt_copy: Path) -> None:
    poke(
        ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 5
    )  # a skipped tensor is never hashed: goes unnoticed
    shards = load(ckpt_copy, skip="mtp.*")  # one glob as a string is one glob, not its characters
    mine = shards.report.mine
    assert list(shards.state_dict()) == ["head.weight"]
    assert mine.bytes_read == mine.bytes_hashed == nbytes(ckpt_copy, ["head.weight"])
    assert mine.skipped == len(all_names(ckpt_copy)) - 1 and "skipped 61" in shards.report.table()


def input_scales(root: Path, manifest: str) -> list[str]:
    names = [f"mtp.0.ffn.experts.{e}.w{w}.input_scale" for e in range(EXPERTS) for w in (1, 2, 3)]
    add_tensors(root, {n: torch.tensor(0.5, dtype=torch.float32) for n in names}, manifest=manifest)
    return names


def test_input_scale_skip_rule_in_a_config_file(ckpt_copy: Path, tmp_path: Path) -> None:
    names = input_scales(ckpt_copy, manifest="wrong")  # any hash of them would fail
    config = config_with(tmp_path, '[[rules]]\nmatch = "*.input_scale"\nrole = "skip"\n')
    shards = load(ckpt_copy, config=str(config))
    assert shards.report.mine.skipped == len(names)
    assert not any(n.endswith(".input_scale") for n in shards.state_dict())
    assert shards.report.mine.bytes_hashed == nbytes(
        ckpt_copy, set(all_names(ckpt_copy)) - set(names)
    )
    with pytest.raises(
        LoadError, match=r"\.input_scale: sha256"
    ):  # without the rule: served, hashed, caught
        load(ckpt_copy)


def test_scalar_input_scales_load_as_scalars(ckpt_copy: Path) -> None:
    input_scales(ckpt_copy, manifest="right")
    sd = load(ckpt_copy).state_dict()
    t = sd["mtp.0.ffn.experts.5.w2.input_scale"]
    assert t.shape == () and t.dtype == torch.float32 and float(t) == 0.5


def test_deferred_tensors_are_located_not_loaded(ckpt_copy: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.6.w2.weight", 9)  # deferred: not hashed by the load
    shards = load(ckpt_copy, defer=("head.weight", "mtp.0.ffn.experts.*"))
    manifest = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"]
    located = {d.name: d for d in shards.deferred()}
    assert not set(located) & set(shards.state_dict())  # no tensor for a deferred name
    assert len(located) == 1 + 6 * EXPERTS and shards.report.mine.deferred == len(located)
    for name, d in located.items():
        path, off, n = tensor_offset(ckpt_copy, name)
        assert (d.path, d.offset, d.nbytes) == (path.absolute(), off, n) and d.verified is False
        assert (d.dtype, list(d.shape), d.sha256) == (
            manifest[name]["dtype"],
            manifest[name]["shape"],
            manifest[name]["sha256"],
        )
    assert shards.report.mine.bytes_hashed == nbytes(
        ckpt_copy, set(all_names(ckpt_copy)) - set(located)
    )
    assert b"".join(located["head.weight"].chunks(1000)) == stored_bytes(ckpt_copy, "head.weight")
    with pytest.raises(
        CheckpointError,
        match=r"experts\.6\.w2\.weight: sha256 .* does not match .*, the manifest's sha256 of the "
        r"tensor \(the file changed since the load\?\)",
    ):  # the model's own stream checks, naming what vouched
        hashlib.sha256(b"".join(located["mtp.0.ffn.experts.6.w2.weight"].chunks()))


def test_a_deferred_locator_refuses_a_fifo_in_its_place(ckpt_copy: Path, tmp_path: Path) -> None:
    import os

    d = next(t for t in load(ckpt_copy, defer=("head.weight",)).deferred())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    moved = DeferredTensor(
        d.name, fifo, d.offset, d.nbytes, d.dtype, d.shape, d.sha256, d.vouched_by
    )
    with pytest.raises(CheckpointError, match="is a FIFO; refused"):
        next(moved.chunks())


@pytest.mark.parametrize(
    "option, glob",
    [("skip", "*.scale"), ("defer", "*.scale"), ("skip", "mtp.0.ffn.experts.1.w1.scale")],
)
def test_a_glob_that_takes_only_scales_is_refused(small_ckpt: Path, option: str, glob: str) -> None:
    # a scale goes wherever its weight goes: such a rule used to do nothing and report "skipped 0"
    with pytest.raises(
        LoadError,
        match=rf"{option} rule \(match '{re.escape(glob)}', role {option}\) matches \d+ "
        rf"scale tensor\(s\) of weights it does not {option} \(e\.g\. "
        r"mtp\.0\.\S+\.scale, the scale of mtp\.0\.\S+\.weight\): scales follow their "
        "weights",
    ):
        load(small_ckpt, **{option: glob})


def test_a_glob_taking_weights_takes_their_scales(small_ckpt: Path) -> None:
    shards = load(small_ckpt, skip="mtp.0.ffn.experts.1.w1.*")  # weight and scale: both skipped
    assert (
        shards.report.mine.skipped == 2
        and "mtp.0.ffn.experts.1.w1.scale" not in shards.state_dict()
    )


def test_a_load_that_serves_nothing_fails(small_ckpt: Path, capsys: pytest.CaptureFixture) -> None:
    from tpload.cli import main

    with pytest.raises(
        LoadError,
        match=r"nothing to load: every tensor of \S+ is skipped \(62 tensors, by skip rule "
        r"\(match '\*', role skip\)\)",
    ):
        load(small_ckpt, skip="*")
    for argv in ([str(small_ckpt), "--no-progress"], ["plan", str(small_ckpt), "--tp", "1"]):
        assert main([*argv, "--skip", "*"]) == 1
        err = capsys.readouterr().err
        assert "nothing to load" in err and "Traceback" not in err, argv


@pytest.mark.parametrize("glob", ["*.weight_scale_inv", "*_scale*"])
def test_a_published_layout_s_scale_globs_are_refused_by_plan_too(
    tmp_path: Path, glob: str, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli import main
    from tpload.tools.published import write_published

    root = write_published(
        tmp_path / "c", "deepseek-v3-tiny"
    )  # FP8 blocks: .weight and .weight_scale_inv
    assert main(["plan", str(root), "--tp", "1", "--skip", glob]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and f"skip rule (match '{glob}', role skip) matches 78 scale tensor(s)" in err
    )
    assert "the scale of model.layers.0.mlp.down_proj.weight): scales follow their weights" in err

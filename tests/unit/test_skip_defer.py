"""Skip and defer rules under real torchrun: skipped tensors are neither read nor hashed,
deferred ones are not uploaded but located (and still not hashed), and the report counts both."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tpload.deferred import DeferredTensor
from tpload.errors import CheckpointError

from .ckpt_tools import add_tensors, all_names, config_with, nbytes, serve, stored_bytes
from .helpers import error_of, poke, tensor_offset, tpload_cli

EXPERTS = 8



def test_skip_mtp_reads_and_hashes_only_the_head(ckpt_copy: Path, tmp_path: Path) -> None:
    # a skipped tensor is never hashed: a corrupt byte in it must go unnoticed
    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 5)
    docs = serve(ckpt_copy, tmp_path / "o", 2, skip="mtp.*")
    ranks = docs[0]["report"]["ranks"]
    head = nbytes(ckpt_copy, ["head.weight"])
    assert [d["names"] for d in docs] == [["head.weight"], ["head.weight"]]
    assert [r["bytes_read"] for r in ranks] == [head // 2, head // 2]
    assert sum(r["bytes_hashed"] for r in ranks) == head  # node hashing: the head, once
    assert all(r["skipped"] == len(all_names(ckpt_copy)) - 1 for r in ranks)
    assert "skipped 61" in tpload_cli(2, "--checkpoint", str(ckpt_copy), "--skip", "mtp.*").out


def input_scales(root: Path, manifest: str) -> list[str]:
    names = [f"mtp.0.ffn.experts.{e}.w{w}.input_scale" for e in range(EXPERTS) for w in (1, 2, 3)]
    add_tensors(root, {n: torch.tensor(0.5, dtype=torch.float32) for n in names}, manifest=manifest)
    return names


def test_input_scale_skip_rule_in_a_config_file(ckpt_copy: Path, tmp_path: Path) -> None:
    names = input_scales(ckpt_copy, manifest="wrong")  # any hash of them would fail
    config = config_with(tmp_path, '[[rules]]\nmatch = "*.input_scale"\nrole = "skip"\n')
    docs = serve(ckpt_copy, tmp_path / "o", 2, config=str(config))
    ranks = docs[0]["report"]["ranks"]
    assert all(r["skipped"] == len(names) for r in ranks)
    assert not any(n.endswith(".input_scale") for d in docs for n in d["names"])
    used = set(all_names(ckpt_copy)) - set(names)
    assert sum(r["bytes_hashed"] for r in ranks) == nbytes(ckpt_copy, used)
    # without the rule they are served, hashed, and the wrong manifest entry is caught
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), logs=tmp_path / "logs")
    assert run.rc != 0
    assert ".input_scale: sha256" in error_of(run.rank_err[0], 0)


def test_deferred_tensors_are_located_not_loaded(ckpt_copy: Path, tmp_path: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.6.w2.weight", 9)  # deferred: not hashed by the load
    docs = serve(ckpt_copy, tmp_path / "o", 2, ep="2", tp="1", defer="head.weight,mtp.0.ffn.experts.*")
    manifest = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"]
    held = []
    for rank, doc in enumerate(docs):
        located = {d["name"]: d for d in doc["deferred"]}
        assert not set(located) & set(doc["names"])  # no tensor for a deferred name
        assert [d["name"] for d in doc["deferred"]] == sorted(located, key=_natural)
        experts = sorted({int(n.split(".")[4]) for n in located if ".experts." in n})
        held.append(experts)
        assert "head.weight" in located and len(located) == 1 + 6 * len(experts)
        for name, d in located.items():
            path, off, n = tensor_offset(ckpt_copy, name)
            assert (Path(d["path"]), d["offset"], d["nbytes"]) == (path.absolute(), off, n)
            assert Path(d["path"]).is_absolute() and d["verified"] is False
            assert (d["dtype"], d["shape"], d["sha256"]) == (manifest[name]["dtype"], manifest[name]["shape"],
                                                             manifest[name]["sha256"])
        assert doc["report"]["ranks"][rank]["deferred"] == len(located)
    assert held == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a rank locates only experts its ep group holds
    ranks = docs[0]["report"]["ranks"]
    deferred = {n for n in all_names(ckpt_copy) if n == "head.weight" or ".experts." in n}
    assert sum(r["bytes_hashed"] for r in ranks) == nbytes(ckpt_copy, set(all_names(ckpt_copy)) - deferred)
    # the locator lets the model stream and check the bytes itself
    good = next(DeferredTensor(**d | {"path": Path(d["path"]), "shape": tuple(d["shape"])})
                for d in docs[0]["deferred"] if d["name"] == "head.weight")
    assert b"".join(good.chunks(1000)) == stored_bytes(ckpt_copy, "head.weight")
    bad = next(DeferredTensor(**d | {"path": Path(d["path"]), "shape": tuple(d["shape"])})
               for d in docs[1]["deferred"] if d["name"] == "mtp.0.ffn.experts.6.w2.weight")
    with pytest.raises(CheckpointError, match="experts.6.w2.weight: sha256"):
        hashlib.sha256(b"".join(bad.chunks()))


def _natural(name: str) -> tuple:
    import re
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))

"""Pre-partitioned checkpoints under real torchrun: each rank reads and hashes only its own file and
serves exactly what a load of the source serves (the unit tier covers the export's files, refusals
and corruptions in-process)."""

from __future__ import annotations

from pathlib import Path

import torch

from tpload.attest.predict import predict
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.tools.export import export

from ..ckpt_tools import serve


def data_bytes(path: Path) -> int:
    """A safetensors file's data bytes (file size less its header), read without tpload."""
    with open(path, "rb") as f:
        return path.stat().st_size - 8 - int.from_bytes(f.read(8), "little")


def test_an_export_loads_from_each_rank_s_own_file(small_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "tp1ep2"
    export(small_ckpt, out, Layout(1, 2), load_config())
    docs = serve(out, tmp_path / "x", 2, tp="1", ep="2")
    source = predict(
        small_ckpt, load_config(), Layout(1, 2), "packed"
    )  # the source's digests, on the CPU
    ranks = docs[0]["report"]["ranks"]
    for r in range(2):
        own = out / f"rank-{r:05d}-of-00002.safetensors"
        assert (
            ranks[r]["bytes_read"] == data_bytes(own) == ranks[r]["bytes_hashed"]
        )  # its own file, once
        assert ranks[r]["digest"] == source[r]
    a, b = torch.load(tmp_path / "x" / "rank0.pt"), torch.load(tmp_path / "x" / "rank1.pt")
    assert not set(n for n in a if ".experts." in n) & set(n for n in b if ".experts." in n)

"""One worker's load into an engine, on 2 real torchrun ranks (gloo), with a stand-in engine: the
report carries the hand-off's figures, a hand-off that fails on one rank only (a loader asking for
another rank's rows, a parameter left unfilled, a window put in torch.cat under map()) fails every
rank with the same message, and a tensor no loader read fails both ranks, naming it, with a
non-zero exit, even with no set of expected parameters (as vLLM gives none for a quantized
model)."""

from __future__ import annotations

import json
from pathlib import Path

from tpload.tools.published import write_published

from ..helpers import torchrun

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "engine_handoff.py")


def test_a_hand_off_failing_on_one_rank_fails_both_with_one_message(tmp_path: Path) -> None:
    root = write_published(tmp_path / "llama", "llama-tiny")
    out = tmp_path / "out"
    out.mkdir()
    run = torchrun(2, [WORKER, str(root), str(out)], timeout=240)
    said = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert set(said[0]) == {"ok", "outside", "missing", "cat", "unconsumed"}, run.err[-3000:]
    assert said[0] == said[1]  # one verdict
    assert said[0]["ok"] == ""
    outside = said[0]["outside"]
    assert outside.startswith(
        "tpload hand-off to test failed on rank 1 of 2; the engine must not serve:"
    )
    assert outside.endswith(
        "\nrank 1: model.layers.0.mlp.up_proj.weight (rank 1): the engine asked for [0:128] of "
        "dimension 0; this rank holds [128:256, 0:128] of (256, 128): its sharding differs from "
        "the config's rule for this tensor (docs/engines.md)"
    )
    assert said[0]["missing"] == (
        "tpload hand-off to test failed on rank 1 of 2; the engine must not serve:\n"
        "rank 1: 1 parameter(s) of the test model were not filled: "
        "model.layers.0.mlp.up_proj.weight"
    )
    assert said[0]["cat"] == (
        "tpload hand-off to test failed on rank 1 of 2; the engine must not serve:\n"
        "rank 1: model.layers.0.mlp.up_proj.weight (rank 1): the engine's weight loader used "
        "torch.cat on the whole tensor; this rank holds only [128:256, 0:128] of (256, 128) "
        "(tpload hands over windows: a loader may read shapes and narrow to its part, nothing "
        "else)"
    )
    forgotten = (
        "1 tensor(s) tpload handed over were not consumed by test's weight loaders: "
        "model.layers.1.self_attn.o_proj.weight (taken, never read (this rank holds {})); every "
        "handed tensor must be read, or be declared skipped on purpose by the engine integration "
        "(docs/engines.md)"
    )
    assert said[0]["unconsumed"] == (
        "tpload hand-off to test failed on rank 0, 1 of 2; the engine must not serve:"
        "\nrank 0: "
        + forgotten.format("[0:128, 0:64]")
        + "\nrank 1: "
        + forgotten.format("[0:128, 64:128]")
    )
    assert run.rc != 0 and "model.layers.1.self_attn.o_proj.weight (taken, never read" in run.err
    report = json.loads((out / "report.json").read_text())
    assert report["engine"]["name"] == "test" and [
        r["rank"] for r in report["engine"]["ranks"]
    ] == [0, 1]
    for r in report["engine"]["ranks"]:
        assert r["problem"] == "" and r["handed"] == report["ranks"][r["rank"]]["tensors"] > 0
    assert [r["bytes_read"] for r in report["ranks"]] == [
        r["windows_bytes"] for r in report["engine"]["ranks"]
    ]
    assert [s["glob"] for s in report["engine"]["skipped"]] == [
        "*.rotary_emb.inv_freq",
        "*.rotary_emb.cos_cached",
        "*.rotary_emb.sin_cached",
    ]

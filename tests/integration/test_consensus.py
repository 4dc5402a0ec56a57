"""Failing together: one rank's early failure, a dead rank, and embedded callers that call load()
more than once. Each is a real torchrun launch (gloo; the early failure and the embedded caller's
calls share one); every rank must end with the same message, in bounded time, with no weights
handed back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ..helpers import HERE, error_of, load_error, poke, torchrun

BOUND_S = 60
EMBED, KILL = str(HERE / "workers" / "embed.py"), str(HERE / "workers" / "kill.py")


def outcomes(out: Path, nproc: int) -> list[list[dict]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def embedded(small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[dict]]:
    """One launch of an embedding caller, three load() calls on 2 ranks: (0) rank 1 alone gets a
    checkpoint whose index names a shard that is not there; (1) rank 1 alone gets an invalid
    option; (2) a good call everywhere. Each rank's outcomes, by call."""
    holed = tmp_path_factory.mktemp("holed") / "ckpt"
    shutil.copytree(small_ckpt, holed)
    (holed / "model-00002-of-00002.safetensors").unlink()
    calls = [
        {"checkpoint": str(small_ckpt), "per_rank": {"1": {"checkpoint": str(holed)}}},
        {"checkpoint": str(small_ckpt), "per_rank": {"1": {"samples": -1}}},
        {"checkpoint": str(small_ckpt)},
    ]
    out = tmp_path_factory.mktemp("embedded")
    run = torchrun(2, [EMBED, str(out), json.dumps(calls)])
    assert run.rc == 0, run.text
    assert run.seconds < BOUND_S
    ranks = outcomes(out, 2)
    assert all(o["seconds"] < BOUND_S for r in ranks for o in r), ranks
    return ranks


def test_one_rank_failing_to_open_the_checkpoint_fails_every_rank(
    embedded: list[list[dict]],
) -> None:
    # rank 1 alone gets a checkpoint whose index names a shard that is not there: it fails while
    # opening it, before any collective; rank 0's load is fine and must still return nothing
    (a, _, _), (b, _, _) = embedded
    assert a["returned"] is False and b["returned"] is False
    assert a["error"] == b["error"]
    assert "load failed on rank 1 (1 of 2 ranks); no rank returned weights" in a["error"]
    assert "shard model-00002-of-00002.safetensors does not exist" in a["error"]


def test_a_failed_call_does_not_desynchronise_the_next(embedded: list[list[dict]]) -> None:
    # call 1 fails on rank 1 only, before anything else (an invalid option); call 2 is fine
    # everywhere. Both ranks must fail call 1 with rank 1's message, and both must load call 2
    # (after two failed calls in this launch).
    (_, a1, a2), (_, b1, b2) = embedded
    assert not a1["returned"] and not b1["returned"] and a1["error"] == b1["error"]
    assert "rank 1: invalid option: samples= must be between 0 and 16777216, got -1" in a1["error"]
    assert a2["returned"] and b2["returned"] and a2["digest"] != b2["digest"]


def test_a_killed_rank_is_named_and_nobody_hangs(small_ckpt: Path, tmp_path: Path) -> None:
    run = torchrun(2, [KILL, str(small_ckpt), "1", "3", "rank"], logs=tmp_path / "logs")
    assert run.rc != 0 and run.seconds < BOUND_S
    assert "SIGKILL" in run.err or "-9" in run.err  # torchrun saw rank 1 die
    msg = error_of(run.rank_err[0], 0)
    # torchrun may also SIGTERM rank 0 once rank 1 is gone: it still reaches the exchange, and names
    # rank 1
    assert (
        "lost the other ranks in the final exchange: rank 1 never reached it (died or hung)" in msg
    ), run.rank_err[0]
    assert error_of(run.rank_err[1], 1) == ""  # the killed rank printed nothing


def test_the_command_line_fails_every_rank_with_one_message(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    from ..helpers import tpload_cli

    poke(
        ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 200 * 128 + 1000
    )  # in rank 1's half: rank 1 hashes it?
    run = tpload_cli(2, str(ckpt_copy), logs=tmp_path / "logs")
    assert run.rc != 0 and run.seconds < BOUND_S
    reporter, msg = load_error(
        run
    )  # printed once, by the lowest failing rank; the other points to it
    assert "no rank returned weights" in msg and reporter == int(
        msg.split("load failed on rank ")[1][0]
    )
    assert "mtp.0.ffn.experts.3.w1.weight" in msg and "does not match the manifest" in msg

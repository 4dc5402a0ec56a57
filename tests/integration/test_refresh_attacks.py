"""The refresh attacked by a member running modified code or misused by its caller, one torchrun
launch a family (tests/workers/refresh_attacks.py: a trainer process and an engine process):
oversized and misordered frames, concurrent and repeated calls, junk manifests, stalled and
departed members. Strangers on every port are the quick tier's other launch
(tests/integration/test_refresh.py).

Each family must show: no engine process lost (both ranks exit 0 and write their record), no wait
past the timeout + 5 s, every refusal one line in the documented form with the old version kept
whole, and the next good round served."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tpload.tools.published import write_published

from ..ckpt_tools import ec_keypair
from ..helpers import HERE, torchrun

WORKER = str(HERE / "workers" / "refresh_attacks.py")
TIMEOUT_S = 3.0  # the worker's


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    root = tmp_path_factory.mktemp("attacks")
    v1 = write_published(root / "v1", "llama-tiny", seed=1)
    v2 = write_published(root / "v2", "llama-tiny", seed=2)
    key, pub = ec_keypair(root, "trainer")
    ec_keypair(root, "other")  # the junk manifests' signer
    return v1, v2, key, pub


def launch(family: str, checkpoints: tuple[Path, Path, Path, Path], out: Path) -> dict:
    v1, v2, key, pub = checkpoints
    out.mkdir()
    run = torchrun(2, [WORKER, family, str(v1), str(v2), str(key), str(pub), str(out)])
    assert run.rc == 0, run.text[-4000:]  # neither process lost
    said = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    engine = said[1]
    for case, got in engine.items():
        assert got["s"] < TIMEOUT_S + 5, (case, got)  # nobody waited past the timeout
        line = got["error"]
        if line:
            assert line.startswith("refresh refused: engine rank 0"), (case, line)
            assert line.endswith("; the served version is unchanged"), (case, line)
            assert "\n" not in line and "\x1b" not in line, (case, line)
        assert got["same"], f"{case}: the engine's parameters are not version {got['served']}'s"
    return said


def refused(said: dict, case: str, words: str, served: int) -> str:
    got = said[1][case]
    assert re.search(words, got["error"]), (case, got["error"])
    assert got["served"] == served, (case, got)
    assert said[0][case]["error"], (case, "the trainer was told nothing")
    return str(got["error"])


def served(said: dict, case: str, version: int) -> None:
    assert said[1][case]["error"] == "" and said[0][case]["error"] == "", (case, said)
    assert said[1][case]["served"] == version


def test_frames_not_the_protocols_break_the_group_not_the_engine(checkpoints, tmp_path) -> None:
    said = launch("frames", checkpoints, tmp_path / "out")
    served(said, "v1", 1)
    refused(said, "oversized", r"trainer rank 0 was lost during .*broke the protocol", 1)
    refused(said, "control", r"trainer rank 0 was lost during .*broke the protocol", 1)
    served(said, "v2", 2)


def test_concurrent_and_repeated_calls_are_refused_and_the_round_goes_on(
    checkpoints, tmp_path
) -> None:
    said = launch("calls", checkpoints, tmp_path / "out")
    served(said, "concurrent", 1)  # the running round went on
    assert "send() was called while another call" in said[0]["concurrent"]["second"], said[0]
    served(said, "restart", 2)
    assert "start() was called while version 2 is being" in said[1]["restart"]["second_start"]
    e = said[1]["restart"]
    assert "receive() was called after version 2 was" in e["late_receive"], e
    assert "receive() was called before start()" in e["unopened"], e
    for call in ("second_start", "late_receive", "unopened"):  # refused at once: nothing waited
        assert e[call].endswith("(0.0 s)"), e
    served(said, "v3", 3)


def test_junk_manifests_are_refused_before_they_are_parsed_or_allocated(
    checkpoints, tmp_path
) -> None:
    said = launch("junk", checkpoints, tmp_path / "out")
    refused(said, "junk", r"does not verify with", 0)
    line = refused(said, "huge", r"manifest", 0)
    assert said[1]["huge"]["rss_mib"] < 16, said[1]["huge"]  # 32 MiB announced, never allocated
    assert said[1]["huge"]["s"] < 5, line
    served(said, "v1", 1)


def test_stalled_and_departed_members_are_named_within_the_timeout(checkpoints, tmp_path) -> None:
    said = launch("members", checkpoints, tmp_path / "out")
    served(said, "v1", 1)
    refused(said, "stall", r"trainer rank 0 was lost during the version manifest", 1)
    refused(said, "leave", r"trainer rank 0 was lost", 1)
    served(said, "v2", 2)

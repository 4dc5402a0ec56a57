"""The verified refresh without an engine (issue 30's quick tier): one torchrun launch of 4 ranks,
2 trainer ranks pushing into a stand-in engine of 2 engine ranks at tp 2 (tests/workers/refresh.py),
round after round in one world: a good version, a byte flipped in transit, a missing tensor, an old
version, a trainer rank whose source raises, then a good version again at sha256 strength with a
signed manifest from a new sender. All the while a stranger (tests/stranger.py) hits every port the
refresh listens on, the hub's and each member's: it holds no slot and aborts nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tpload.tools.published import write_published

from ..ckpt_tools import ec_keypair
from ..helpers import HERE, torchrun
from ..stranger import Stranger

WORKER = str(HERE / "workers" / "refresh.py")
CASES = ("v1", "flipped", "missing", "old", "raising", "v2")
TRAINERS, ENGINES = (0, 1), (2, 3)


@dataclass(frozen=True)
class Rounds:
    said: dict[int, dict]
    """Each global rank's record, by case."""
    hits: dict[int, int]
    """The stranger's connections, by port it found."""


@pytest.fixture(scope="module")
def rounds(tmp_path_factory: pytest.TempPathFactory) -> Rounds:
    root = tmp_path_factory.mktemp("refresh")
    v1 = write_published(root / "v1", "llama-tiny", seed=1)
    v2 = write_published(root / "v2", "llama-tiny", seed=2)
    key, pub = ec_keypair(root, "trainer")
    out = root / "out"
    out.mkdir()
    stranger = Stranger(out)
    stranger.start()
    try:
        run = torchrun(4, [WORKER, str(v1), str(v2), str(key), str(pub), str(out)], timeout=240)
    finally:
        stranger.stop.set()
        stranger.join(10)
    assert run.rc == 0, run.text[-4000:]
    said = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (*TRAINERS, *ENGINES)}
    return Rounds(said, dict(stranger.hits))


def test_a_stranger_on_every_port_of_the_refresh_holds_no_slot_and_aborts_nothing(
    rounds: Rounds,
) -> None:
    # two hubs (two rendezvous) and the listeners of the members that accept (every one but the
    # last group rank), each hit while the group formed; every rank still ran every round
    assert len(rounds.hits) >= 2 + 3, rounds.hits
    assert all(n >= 1 for n in rounds.hits.values()), rounds.hits
    assert all(set(rounds.said[r]) == set(CASES) for r in (*TRAINERS, *ENGINES))


def test_a_good_round_serves_the_digests_a_load_of_its_checkpoint_gives(rounds: Rounds) -> None:
    for case in ("v1", "v2"):
        sent = rounds.said[0][case]["digests"]  # trainer rank 0's manifest: every engine rank's
        for e, r in enumerate(ENGINES):
            got = rounds.said[r][case]
            assert got["error"] == "", got
            assert got["digest"] == got["load_digest"] == sent[e]  # tpload.load of that checkpoint
            assert got["same"], f"{case}: engine rank {e}'s parameters are not the load's tensors"
        assert all(rounds.said[t][case]["error"] == "" for t in TRAINERS)
    assert rounds.said[ENGINES[0]]["v1"]["digest"] != rounds.said[ENGINES[1]]["v1"]["digest"]
    assert rounds.said[ENGINES[0]]["v1"]["digest"] != rounds.said[ENGINES[0]]["v2"]["digest"]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        (
            "flipped",
            r"engine rank 0, version 2: tensor model\.embed_tokens\.weight \(from trainer rank "
            r"1\): its window arrived with fingerprint .*, the manifest says .* \(corrupted or "
            r"lost in transport\)",
        ),
        (
            "missing",
            r"version 2: the version's tensors are not the served model's: missing "
            r"model\.layers\.1\.mlp\.down_proj\.weight",
        ),
        ("old", r"version 1 is not newer than the served version 1"),
        (
            "raising",
            r"engine rank 0: the trainer aborted version 2: trainer rank 1: RuntimeError: the "
            r"source broke",
        ),
    ],
)
def test_a_bad_round_is_refused_with_one_line_everywhere_and_keeps_the_old_weights(
    rounds: Rounds, case: str, words: str
) -> None:
    import re

    lines = {rounds.said[r][case]["error"] for r in (*TRAINERS, *ENGINES)}
    assert len(lines) == 1, lines  # the same line on every engine rank, and the trainers get it
    (line,) = lines
    assert line.startswith("refresh refused: ") and "\n" not in line, line
    assert re.search(words, line), line
    assert line.endswith("; the served version is unchanged"), line
    for r in ENGINES:
        got = rounds.said[r][case]
        assert got["served"] == 1  # still version 1
        assert got["same"] and got["kept"], f"{case}: engine rank {r - 2}'s weights changed"


def test_a_trainer_rank_whose_source_raises_fails_every_rank_in_seconds(rounds: Rounds) -> None:
    for r in (*TRAINERS, *ENGINES):
        assert "RuntimeError: the source broke" in rounds.said[r]["raising"]["error"]
    for r in ENGINES:  # the timeout is 120 s: nobody waited for it
        assert rounds.said[r]["raising"]["s"] < 10, rounds.said[r]["raising"]

"""The refresh in the slow tier: a trainer rank killed mid-update (a real SIGKILL under torchrun;
tests/workers/refresh_kill.py) ends the round on every engine rank with one line naming it, in
bounded time, with the old version kept; and a new trainer then serves the next version."""

from __future__ import annotations

import json

import pytest

from tpload.tools.published import write_published

from ..helpers import HERE, torchrun

pytestmark = pytest.mark.slow
WORKER = str(HERE / "workers" / "refresh_kill.py")


def test_a_trainer_killed_mid_update_is_named_everywhere_and_the_next_trainer_serves(
    tmp_path,
) -> None:
    v1 = write_published(tmp_path / "v1", "llama-tiny", seed=1)
    v2 = write_published(tmp_path / "v2", "llama-tiny", seed=2)
    out = tmp_path / "out"
    out.mkdir()
    run = torchrun(4, [WORKER, str(v1), str(v2), str(out)], timeout=240)
    assert "SIGKILL" in run.err or "-9" in run.err, run.text[-3000:]  # torchrun saw rank 1 die
    assert not (out / "rank1.json").exists()
    said = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 2, 3)}
    engines = [said[2], said[3]]
    assert all(e["v1"]["error"] == "" and e["v1"]["same"] for e in engines)
    lines = {e["killed"]["error"] for e in engines}
    assert len(lines) == 1, lines  # the same line on both engine ranks
    (line,) = lines
    assert line.startswith("refresh refused: engine rank ") and "trainer rank 1 was lost" in line
    assert line.endswith("; the served version is unchanged")
    for e in engines:
        assert e["killed"]["served"] == 1 and e["killed"]["same"]  # version 1 kept, whole
        assert e["killed"]["seconds"] < 30  # named when the connection dropped, not at a timeout
        assert e["v3"] == {"error": "", "seconds": e["v3"]["seconds"], "served": 3, "same": True}
    assert said[0]["killed"]["error"].startswith("version 2: trainer rank 0: ")  # never a hang
    assert said[0]["v3"] == {"error": ""}

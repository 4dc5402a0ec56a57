"""A load reads each small file that shapes its plan once (config.json, the index, the manifest),
whether a manifest pins them or a hub snapshot's blob names vouch for them: the bytes checked are
the bytes the catalogue, the config's pick and the planner use, handed on, not read again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpload.storage.hub import to_hub_cache
from tpload.tools.published import write_published

COUNT_OPENS = """
import collections, json, sys
opens = collections.Counter()
root = sys.argv[1]
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(root):
        opens[args[0].rsplit("/", 1)[-1]] += 1
sys.addaudithook(hook)
import tpload
tpload.load(root, progress=False).release()
print(json.dumps(opens))
"""


def opens(root: Path) -> dict[str, int]:
    run = subprocess.run(
        [sys.executable, "-c", COUNT_OPENS, str(root)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    counts: dict[str, int] = json.loads(run.stdout.splitlines()[-1])
    return counts


@pytest.mark.parametrize("where", ["manifest", "hub"])
def test_each_small_file_is_read_once(tmp_path: Path, where: str) -> None:
    if where == "manifest":
        root = write_published(tmp_path / "llama", "llama-tiny")
    else:
        plain = write_published(tmp_path / "plain", "gpt-oss-tiny", manifest=False)
        root = to_hub_cache(plain, tmp_path / "hub", "openai/gpt-oss-tiny")
    got = opens(root)
    small = {n: k for n, k in got.items() if n.endswith(".json")}
    assert "config.json" in small and "model.safetensors.index.json" in small, got
    assert set(small.values()) == {1}, small  # was 3 (index) and 4 (a snapshot's config.json)

"""A pinned config.json under real torchrun: edited after `tpload manifest`, every rank fails naming
it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import load_error, tpload_cli


# Every rank failing before its first read, the message printed once, is the quick tier's launch of
# tests/integration/test_cli.py (a folder with no checkpoint); the pin's refusal of an edited
# config.json is unit-tested in-process (tests/unit/storage/test_pins.py): this launch is the slow
# tier's.
@pytest.mark.slow
def test_an_edited_pinned_config_json_fails_every_rank(tmp_path: Path) -> None:
    from tpload.tools.offline import write_manifest
    from tpload.tools.published import write_published

    root = write_published(tmp_path / "llama", "llama-tiny")
    write_manifest(root, force=True)  # pins config.json and the index
    config = json.loads((root / "config.json").read_text())
    config["num_key_value_heads"] = (
        1  # what a folder writer would change to alter every rank's windows
    )
    (root / "config.json").write_text(json.dumps(config))
    run = tpload_cli(2, str(root), "--tp", "2", logs=tmp_path / "logs")
    ranks = "".join(run.rank_err.values())
    assert run.rc != 0, run.text + ranks
    _, message = load_error(run)  # printed once in full; the other rank points to it
    assert "(2 of 2 ranks)" in message, message  # the verdict: both ranks failed
    assert (
        f"{root}/config.json: model config has sha256" in message
        and "NATIVE_MANIFEST.json pins" in message
    )
    assert "Traceback" not in ranks

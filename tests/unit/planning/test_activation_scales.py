"""``skip_activation_scales``: ModelOpt NVFP4's single-value ``*.input_scale`` tensors skipped by a
named switch (load(), the flag, the engine's extra config); ``plan`` counts them and their
per-tensor cost."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tpload
from tpload.cli import main
from tpload.integrations.engine import load_options
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published


@pytest.fixture(scope="module")
def nvfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("act") / "nvfp4", "nvfp4-tiny")


def scales(root: Path) -> list[str]:
    tensors = read_native(root)[0].tensors
    return [n for n, m in tensors.items() if n.endswith(".input_scale") and tuple(m.shape) == ()]


def test_the_switch_skips_every_input_scale_and_the_hand_rule_still_does(nvfp4: Path) -> None:
    names = scales(nvfp4)
    assert len(names) == 30  # the miniature has 0-d input_scale tensors
    served = tpload.load(nvfp4, progress=False, device="cpu")
    skipped = tpload.load(nvfp4, progress=False, device="cpu", skip_activation_scales=True)
    by_hand = tpload.load(nvfp4, progress=False, device="cpu", skip="*.input_scale")
    full, less = served.state_dict(), skipped.state_dict()
    assert set(names) <= set(full) and not set(names) & set(less)
    assert set(full) - set(less) == set(names) and set(by_hand.state_dict()) == set(less)
    assert all(torch.equal(full[n], less[n]) for n in less)
    assert skipped.report.ranks[0].skipped == 30
    assert any(
        n.startswith("activation scales: 30 ") and "30 skipped" in n for n in skipped.report.notes
    )
    for s in (served, skipped, by_hand):
        s.release()


def test_plan_counts_them_and_the_flag_skips_them(
    nvfp4: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(nvfp4), "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "activation scales: 30 single-value *.input_scale tensors (4 B stored, a 256 B arena slot"
        in out
    )
    assert "served (--skip-activation-scales skips them)" in out
    assert main(["plan", str(nvfp4), "--tp", "2", "--skip-activation-scales"]) == 0
    assert "30 skipped" in capsys.readouterr().out


def test_the_engine_extra_config_takes_the_switch() -> None:
    opts = load_options(
        {"skip_activation_scales": True}, world=2, engine_device=torch.device("cpu")
    )
    assert opts["skip_activation_scales"] is True
    with pytest.raises(tpload.LoadError, match="skip_activation_scales=: expected True or False"):
        load_options({"skip_activation_scales": "yes"}, world=2, engine_device=torch.device("cpu"))

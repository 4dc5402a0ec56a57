"""Configs: shipped by name, validated on load, fitted to the checkpoint with every problem listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpload.checkpoint import Checkpoint
from tpload.config import load_config, shipped_configs
from tpload.errors import ConfigError
from tpload.plan import Planner


def test_shipped_config_loads_by_name() -> None:
    assert "deepseek-v4-mtp" in shipped_configs()
    cfg = load_config("deepseek-v4-mtp")
    assert cfg.channel_align == 64
    assert cfg.rule_for("mtp.0.ffn.experts.7.w2.weight").split == "cols"
    assert cfg.rule_for("mtp.0.enorm.weight").split == "replicate"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, needle", [
    ('[[rules]]\nmatch = "*"\nrole = "fp5"\n', "role 'fp5' is not one of"),
    ('[[rules]]\nmatch = "*"\nrole = "plain"\nsplit = "diagonal"\n', "split 'diagonal'"),
    ('[[rules]]\nmatch = "*"\nrole = "plain"\ncolour = 1\n', r"unknown keys rules\[1\].colour"),
    ('[[rules]]\nrole = "plain"\n', "needs both 'match' and 'role'"),
    ('[layout]\nchannel_align = 0\n[[rules]]\nmatch = "*"\nrole = "plain"\n', "channel_align must be >= 1"),
    ("rules = [", "not valid TOML"),
    ("", "no \\[\\[rules\\]\\]"),
])
def test_bad_configs_are_named(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, text))


def test_unknown_config_name_lists_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="deepseek-v4-mtp"):
        load_config("no-such-model")


def test_unmatched_tensors_are_all_listed(small_ckpt: Path, tmp_path: Path) -> None:
    cfg = write(tmp_path, '[[rules]]\nmatch = "mtp.*"\nrole = "plain"\n')
    with pytest.raises(ConfigError) as e:
        Planner(Checkpoint(small_ckpt), load_config(cfg))
    assert "head.weight" in str(e.value) and "match no rule" in str(e.value)


def test_role_that_does_not_fit_the_dtype_names_tensor_and_rule(small_ckpt: Path, tmp_path: Path) -> None:
    cfg = write(tmp_path, '[[rules]]\nmatch = "head.weight"\nrole = "fp4"\nsplit = "rows"\n'
                          '[[rules]]\nmatch = "*"\nrole = "plain"\n')
    with pytest.raises(ConfigError) as e:
        Planner(Checkpoint(small_ckpt), load_config(cfg))
    msg = str(e.value)
    assert "head.weight" in msg and "rule 1" in msg and "head.scale" in msg


def test_skip_and_defer_rules(small_ckpt: Path, tmp_path: Path) -> None:
    cfg = write(tmp_path, '[[rules]]\nmatch = "head.weight"\nrole = "skip"\n'
                          '[[rules]]\nmatch = "mtp.*.ffn.gate.*"\nrole = "defer"\n'
                          '[[rules]]\nmatch = "*.scale"\nrole = "skip"\n'
                          '[[rules]]\nmatch = "*"\nrole = "plain"\n')
    # fp8 / fp4 weights under "plain" would be refused: keep only plain-typed tensors
    with pytest.raises(ConfigError, match="plain tensors must be"):
        Planner(Checkpoint(small_ckpt), load_config(cfg))


def test_shipped_configs_are_in_the_wheel(tmp_path: Path) -> None:
    import subprocess
    import sys
    import zipfile
    root = Path(__file__).parent.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                    str(root)], check=True, capture_output=True)
    names = zipfile.ZipFile(next(tmp_path.glob("tpload-*.whl"))).namelist()
    assert "tpload/configs/deepseek-v4-mtp.toml" in names

"""Configs: shipped by name, validated on load, fitted to the checkpoint with every problem
listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpload.loading.planner import planner_of
from tpload.model.errors import ConfigError
from tpload.planning.layout import Layout
from tpload.selection.config import Rule, load_config, shipped_configs, with_rules
from tpload.storage.catalogue import read_native


def Checkpoint(root: Path):  # noqa: N802 - the catalogue the planner reads
    return read_native(root)[0]


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


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[[rules]]\nmatch = "*"\nrole = "fp5"\n', "role 'fp5' is not one of"),
        ('[[rules]]\nmatch = "*"\nrole = "plain"\nsplit = "diagonal"\n', "split 'diagonal'"),
        ('[[rules]]\nmatch = "*"\nrole = "plain"\ncolour = 1\n', r"unknown keys rules\[1\].colour"),
        ('[[rules]]\nrole = "plain"\n', "needs both 'match' and 'role'"),
        (
            '[layout]\nchannel_align = 0\n[[rules]]\nmatch = "*"\nrole = "plain"\n',
            "channel_align must be >= 1",
        ),
        ("rules = [", "not valid TOML"),
        ("", "no \\[\\[rules\\]\\]"),
    ],
)
def test_bad_configs_are_named(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, text))


def test_a_folder_named_like_a_shipped_config_does_not_shadow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint folder called ``llama`` in the working directory (as engines' users keep
    them)."""
    (tmp_path / "llama").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_config("llama").name == "llama"
    assert len(load_config("llama").rules) > 3


def test_unknown_config_name_lists_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="deepseek-v4-mtp"):
        load_config("no-such-model")


def test_unmatched_tensors_are_all_listed(small_ckpt: Path, tmp_path: Path) -> None:
    cfg = write(tmp_path, '[[rules]]\nmatch = "mtp.*"\nrole = "plain"\n')
    with pytest.raises(ConfigError) as e:
        planner_of(Checkpoint(small_ckpt), load_config(cfg))
    assert "head.weight" in str(e.value) and "1 tensor matches no rule" in str(e.value)


def test_role_that_does_not_fit_the_dtype_names_tensor_and_rule(
    small_ckpt: Path, tmp_path: Path
) -> None:
    cfg = write(
        tmp_path,
        '[[rules]]\nmatch = "head.weight"\nrole = "fp4"\nsplit = "rows"\n'
        '[[rules]]\nmatch = "*"\nrole = "plain"\n',
    )
    with pytest.raises(ConfigError) as e:
        planner_of(Checkpoint(small_ckpt), load_config(cfg))
    msg = str(e.value)
    assert "head.weight" in msg and "rule 1" in msg and "head.scale" in msg


def test_skip_and_defer_rules(small_ckpt: Path, tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        '[[rules]]\nmatch = "head.weight"\nrole = "skip"\n'
        '[[rules]]\nmatch = "mtp.*.ffn.gate.*"\nrole = "defer"\n'
        '[[rules]]\nmatch = "mtp.*.ffn.experts.*"\nrole = "skip"\n'
        '[[rules]]\nmatch = "mtp.*.ffn.shared_experts.*"\nrole = "skip"\n'
        '[[rules]]\nmatch = "mtp.*.eh_proj.*"\nrole = "skip"\n'
        '[[rules]]\nmatch = "*"\nrole = "plain"\n',
    )
    planner = planner_of(Checkpoint(small_ckpt), load_config(cfg))
    plan = planner.plan(Layout(1), "packed", 0)
    assert "head.weight" in plan.skipped and "head.weight" not in {i.name for i in plan.items}
    assert sorted(plan.deferred) == ["mtp.0.ffn.gate.bias", "mtp.0.ffn.gate.weight"]
    assert {i.name for i in plan.items} == {
        "mtp.0.enorm.weight",
        "mtp.0.hnorm.weight",
        "mtp.0.norm.weight",
    }


def test_a_plain_rule_over_fp8_weights_is_refused_naming_them(
    small_ckpt: Path, tmp_path: Path
) -> None:
    cfg = write(tmp_path, '[[rules]]\nmatch = "*"\nrole = "plain"\n')
    with pytest.raises(ConfigError) as e:
        planner_of(Checkpoint(small_ckpt), load_config(cfg))
    assert "plain tensors must be BF16/F32/F16/I64" in str(e.value) and "eh_proj.weight" in str(
        e.value
    )


def test_a_skip_glob_that_matches_nothing_is_refused(small_ckpt: Path) -> None:
    with pytest.raises(
        ConfigError, match="skip rule \\(match 'mpt.\\*', role skip\\) matched no tensor"
    ):
        planner_of(Checkpoint(small_ckpt), with_rules(load_config(), skip=("mpt.*",)))


def test_a_skip_glob_shadowed_by_an_earlier_one_is_not_idle(small_ckpt: Path) -> None:
    # "mtp.*" takes every tensor "mtp.0.*" matches: the second rule is no tensor's first match, yet
    # it matches some, so it is no typo
    config = with_rules(load_config(), skip=("mtp.*", "mtp.0.*"))
    planner = planner_of(Checkpoint(small_ckpt), config)
    assert planner.skipped and all(n.startswith("mtp.") for n in planner.skipped)


def test_the_same_globs_in_another_order_or_repeated_give_the_same_config_id() -> None:
    # an engine building globs from a Python set hands them in any order: before, one rank's
    # order against another's was refused as "differ in the config"
    base = load_config()
    one = with_rules(base, skip=("mtp.*", "*.bias"), defer=("*.experts.1.*", "*.experts.2.*"))
    other = with_rules(
        base, skip=("*.bias", "mtp.*", "*.bias"), defer=("*.experts.2.*", "*.experts.1.*")
    )
    assert one.id() == other.id() and one.rules_sha256() == other.rules_sha256()
    assert [r.match for r in one.rules] == [r.match for r in other.rules]
    assert len(other.rules) == len(base.rules) + 4  # the repeated glob is one rule
    # a glob that differs still changes the id, and skip and defer are not the same rules
    assert with_rules(base, skip=("mtp.*",)).id() != one.id()
    assert with_rules(base, skip=("mtp.*",)).id() != with_rules(base, defer=("mtp.*",)).id()
    assert one.id() == one.rules_sha256()[:12] and len(one.rules_sha256()) == 64


def test_shipped_configs_are_in_the_wheel(tmp_path: Path) -> None:
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).parents[3]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    names = zipfile.ZipFile(next(tmp_path.glob("tpload-*.whl"))).namelist()
    assert "tpload/configs/deepseek-v4-mtp.toml" in names
    for package in (
        "codecs",
        "storage",
        "verification",
        "transfer",
        "report",
    ):  # every subpackage ships
        assert f"tpload/{package}/__init__.py" in names


def test_roles_and_splits_are_named_modes_read_from_the_same_strings() -> None:
    from tpload.model.modes import Role, Split

    rule = Rule(match="*.w", role="fp8", split="rows")
    assert rule.role is Role.FP8 and rule.split is Split.ROWS
    assert rule.role == "fp8" and f"{rule.split}" == "rows"  # messages and TOML keep the strings
    assert all(isinstance(r.role, Role) for r in load_config("deepseek-v3").rules)
    with pytest.raises(ConfigError, match="split 'diagonal' is not one of rows, cols, replicate"):
        Rule(match="*", role="plain", split="diagonal")
    with pytest.raises(ConfigError, match="role 'fp3' is not one of"):
        Rule(match="*", role="fp3")

"""The command line in-process (no torchrun: a single rank): the folder positionally, --version,
subcommands, and clear exits."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from safetensors import safe_open

from tpload import __version__
from tpload.cli import main


def test_the_folder_is_taken_positionally_like_every_subcommand(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    report = tmp_path / "r.json"
    assert main([str(small_ckpt), "--no-progress", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "rank node" in out and "verified: 62 tensors by sha256" in out
    assert json.loads(report.read_text())["ranks"][0]["tensors"] > 0


def test_two_different_checkpoints_are_refused(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([str(small_ckpt), "--checkpoint", str(tmp_path)]) == 1
    assert "two checkpoints given" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tpload {__version__}"


def test_an_error_exits_1_with_one_line_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([str(tmp_path / "nothing"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("[rank 0] tpload: error: load failed on rank 0") and "Traceback" not in err
    )


def test_ctrl_c_exits_130_without_a_traceback(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import tpload.api

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tpload.api, "load_in", interrupted)
    assert main([str(small_ckpt), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


def test_synth_writes_a_checkpoint_safetensors_can_read(tmp_path: Path) -> None:
    out = tmp_path / "c"
    assert main(["synth", str(out), "--experts", "3", "--shards", "3"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    manifest = json.loads((out / "NATIVE_MANIFEST.json").read_text())["tensors"]
    assert set(index["weight_map"]) == set(manifest) and len(set(index["weight_map"].values())) == 3
    with safe_open(str(out / index["weight_map"]["mtp.0.ffn.experts.2.w2.weight"]), "pt") as f:
        assert list(f.get_slice("mtp.0.ffn.experts.2.w2.weight").get_shape()) == [256, 128]
    assert main(["synth", str(out)]) == 1  # never over a folder that holds something


def test_export_refuses_a_folder_that_is_not_empty(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine").write_text("keep")
    assert main(["export", str(small_ckpt), str(tmp_path / "x"), "--tp", "2"]) == 1
    assert (
        "export folder is not empty" in capsys.readouterr().err
        and (tmp_path / "x" / "mine").exists()
    )


def test_a_verdict_is_printed_by_its_reporter_and_pointed_to_by_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from tpload.cli.output import fail_rank
    from tpload.errors import LoadError

    files = {rank: tmp_path / f"error-{rank}.json" for rank in ("0", "1")}
    verdict = LoadError(
        "load failed on rank 0, 1 (2 of 2 ranks)\nrank 0, 1: /x: missing", reporter=0
    )
    for rank, file in files.items():
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(file))
        assert fail_rank(verdict, rank) == 1
    err = capsys.readouterr().err
    assert err == (
        "[rank 0] tpload: error: load failed on rank 0, 1 (2 of 2 ranks)\nrank 0, 1: /x: missing\n"
        "[rank 1] tpload: load failed (see rank 0)\n"
    )
    docs = {rank: json.loads(file.read_text())["message"] for rank, file in files.items()}
    assert docs["0"]["message"] == err.split("[rank 1]")[0].strip()  # torchrun's summary quotes it
    assert docs["1"]["message"] == "[rank 1] tpload: load failed (see rank 0)"
    # torchrun names the earliest failure (whole seconds) the root cause: the reporter's, strictly
    assert int(docs["0"]["extraInfo"]["timestamp"]) < int(docs["1"]["extraInfo"]["timestamp"])


def test_a_rank_own_error_is_printed_in_full_by_that_rank(capsys: pytest.CaptureFixture) -> None:
    from tpload.cli.output import fail_rank
    from tpload.errors import LoadError

    assert (
        fail_rank(LoadError("lost the other ranks"), "3") == 1
    )  # no reporter: not a shared verdict
    assert capsys.readouterr().err == "[rank 3] tpload: error: lost the other ranks\n"


LOGS = """
import logging
from tpload.cli.output import configure_logging
configure_logging({spec!r})
logging.getLogger("numba.core.ssa").debug("numba internals")
logging.getLogger("tpload").debug("tpload detail")
logging.getLogger("numba").warning("numba warns")
"""


@pytest.mark.parametrize("spec", ["DEBUG", "debug,numba=DEBUG"])
def test_debug_logging_is_tpload_s_own_and_labels_each_logger(spec: str) -> None:
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", LOGS.format(spec=spec)], capture_output=True, text=True, check=True
    )
    lines = [line.split(" ", 2)[2] for line in p.stderr.splitlines()]  # after the date and time
    foreign = ["numba.core.ssa DEBUG numba internals"] if "numba=" in spec else []
    assert lines == [*foreign, "tpload DEBUG tpload detail", "numba WARNING numba warns"]


def test_an_unknown_log_level_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path), "--log-level", "LOUD"]) == 1
    assert capsys.readouterr().err == (
        "[rank 0] tpload: error: --log-level LOUD: 'LOUD' is not a level (DEBUG, INFO, "
        "WARNING, ERROR, CRITICAL)\n"
    )


def test_verify_says_what_it_checked_and_what_vouched(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tpload.storage.hub import to_hub_cache
    from tpload.tools.published import write_published

    assert main(["verify", str(small_ckpt), "--config", "none"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith(
        "checked 62 tensors, 0.001 GB: each tensor by sha256 against NATIVE_MANIFEST.json"
    )
    assert out[-2].endswith("no value checks (--config none)") and out[-1] == f"{small_ckpt}: OK"
    hub = to_hub_cache(
        write_published(tmp_path / "plain", "gpt-oss-tiny", manifest=False), tmp_path / "hub", "o/m"
    )
    assert main(["verify", str(hub)]) == 0
    line = capsys.readouterr().out.splitlines()[-2]
    assert (
        "files whole, by sha256 against the hub blob it is named by" in line
        and "by config gpt-oss" in line
    )
    assert main(["export", str(small_ckpt), str(tmp_path / "x"), "--tp", "2"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "x")]) == 0
    assert "checked 124 windows in 2 rank file(s)" in capsys.readouterr().out


SHADOWED = """
import importlib.util, sys
sys.path.insert(0, {parent!r})  # as `python -m` puts the current folder first
import tpload  # the clone's folder: no __init__.py, so an empty namespace package
spec = importlib.util.spec_from_file_location("tpload.__main__", {main!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
"""


def test_a_folder_holding_a_clone_is_named_not_an_import_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    import tpload.__main__

    (tmp_path / "tpload" / "tpload").mkdir(parents=True)  # the clone, its package inside
    code = SHADOWED.format(parent=str(tmp_path), main=tpload.__main__.__file__)
    # -S and no PYTHONPATH: no regular tpload on the path (in real life pip install -e's finder,
    # which comes after the path, serves tpload.__main__ from the checkout)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(
        f"tpload: error: the folder {tmp_path / 'tpload'} hides the installed tpload"
    )


def one_line(err: str) -> str:
    """The error a subcommand ended in: exactly one line, no traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_synth_hub_twice_into_one_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["synth", str(tmp_path / "hub"), "--preset", "deepseek-v3-tiny", "--hub", "org/m"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith(
        f"tpload: error: {tmp_path / 'hub' / 'models--org--m'}: this cache already holds org/m"
    )
    assert main([*argv[:-1], "../m"]) == 1 and "expected a repository id ORG/NAME" in one_line(
        capsys.readouterr().err
    )


def test_an_os_error_names_its_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["synth", str(tmp_path / "file" / "c")]) == 1  # a file where a folder must be made
    assert (
        one_line(capsys.readouterr().err)
        == f"tpload: error: {tmp_path / 'file' / 'c'}: Not a directory\n"
    )


def test_a_bug_in_a_subcommand_is_one_line_that_says_how_to_see_it(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import tpload.tools.offline

    def broken(*a: object, **k: object) -> list[str]:
        raise ValueError("a bug")

    monkeypatch.setattr(tpload.tools.offline, "verify_checkpoint", broken)
    assert main(["verify", str(small_ckpt)]) == 1
    assert one_line(capsys.readouterr().err).startswith(
        "tpload: error: unexpected ValueError: a bug (a bug in tpload; "
        "TPLOAD_TRACEBACK=1 shows where)"
    )
    monkeypatch.setenv("TPLOAD_TRACEBACK", "1")
    with pytest.raises(ValueError, match="a bug"):
        main(["verify", str(small_ckpt)])


def test_a_digest_store_that_is_a_file_is_refused_before_any_hashing(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "store").write_text("x")
    for argv in (
        [str(small_ckpt), "--no-progress"],
        ["plan", str(small_ckpt), "--tp", "1", "--write"],
        ["manifest", str(small_ckpt), "--hash", "blake3"],
    ):
        assert main([*argv, "--digest-store", str(tmp_path / "store")]) == 1
        err = one_line(capsys.readouterr().err)
        assert (
            f"--digest-store {tmp_path / 'store'}: {tmp_path / 'store'} is not a folder" in err
        ), argv
        assert (
            "hashed" not in err and "config" not in err
        )  # refused before the checkpoint was even opened


def test_a_report_into_the_checkpoint_leaves_its_manifest_alone(
    ckpt_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    before = manifest.read_bytes()
    assert main([str(ckpt_copy), "--no-progress", "--report", str(manifest)]) == 1
    err = one_line(capsys.readouterr().err)
    assert (
        f"--report {manifest} is inside the checkpoint {ckpt_copy}" in err
        and manifest.read_bytes() == before
    )


def test_a_bad_flag_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--tp", "zero"])
    assert e.value.code == 2 and "argument --tp" in one_line(capsys.readouterr().err)


def test_no_progress_s_help_describes_the_flag() -> None:
    from tpload.cli.parsers import load_parser

    helps = {a.option_strings[0]: a.help for a in load_parser()._actions if a.option_strings}
    assert helps["--no-progress"].startswith("turn off rank 0's progress")


def readme_exit_codes() -> dict[int, str]:
    """README's "Exit codes:" paragraph, as {code: its clause}."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start = readme.index("Exit codes: ")
    text = " ".join(readme[start : readme.index("\n\n", start)].split())
    clauses = re.findall(r"`(\d+)` (.*?)(?=; `\d+` |\. torchrun)", text)
    return {int(code): clause for code, clause in clauses}


def test_readme_s_exit_codes_are_what_its_examples_exit_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every flag README quotes under exit 2 is the parser's refusal (exit 2, one usage line, before
    a rank starts); every one under exit 1 passes the parser and is refused by the load's option
    rules (exit 1, ``invalid option``)."""
    clauses = readme_exit_codes()
    assert set(clauses) == {0, 1, 2, 130}
    assert "unknown flag" in clauses[2] and "on every rank" in clauses[1], clauses
    monkeypatch.chdir(tmp_path)  # README's relative paths: nowhere/ does not exist here
    for code in (2, 1):
        examples = re.findall(r"`(--[^`]*)`", clauses[code])
        assert len(examples) >= 3, clauses[code]
        for example in examples:
            try:
                got = main([*shlex.split(example), "--no-progress"])
            except SystemExit as e:
                got = e.code
            err = capsys.readouterr().err
            assert got == code, (example, err)
            assert ("(usage: " in err) == (code == 2) and ("invalid option" in err) == (code == 1)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written

"""The command line in-process (no torchrun: a single rank): the folder positionally, --version,
subcommands, and clear exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from tpload import __version__
from tpload.__main__ import main


def test_the_folder_is_taken_positionally_like_every_subcommand(small_ckpt: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    report = tmp_path / "r.json"
    assert main([str(small_ckpt), "--no-progress", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "rank node" in out and "verified: 62 tensors by sha256" in out
    assert json.loads(report.read_text())["ranks"][0]["tensors"] > 0


def test_two_different_checkpoints_are_refused(small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(small_ckpt), "--checkpoint", str(tmp_path)]) == 1
    assert "two checkpoints given" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tpload {__version__}"


def test_an_error_exits_1_with_one_line_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "nothing"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("[rank 0] tpload: error: load failed on rank 0") and "Traceback" not in err


def test_ctrl_c_exits_130_without_a_traceback(small_ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
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


def test_export_refuses_a_folder_that_is_not_empty(small_ckpt: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine").write_text("keep")
    assert main(["export", str(small_ckpt), str(tmp_path / "x"), "--tp", "2"]) == 1
    assert "export folder is not empty" in capsys.readouterr().err and (tmp_path / "x" / "mine").exists()


def one_line(err: str) -> str:
    """The error a subcommand ended in: exactly one line, no traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_synth_hub_twice_into_one_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["synth", str(tmp_path / "hub"), "--preset", "deepseek-v3-tiny", "--hub", "org/m"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"tpload: error: {tmp_path / 'hub' / 'models--org--m'}: this cache already holds org/m")
    assert main([*argv[:-1], "../m"]) == 1 and "expected a repository id ORG/NAME" in one_line(capsys.readouterr().err)


def test_an_os_error_names_its_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["synth", str(tmp_path / "file" / "c")]) == 1  # a file where a folder must be made
    assert one_line(capsys.readouterr().err) == f"tpload: error: {tmp_path / 'file' / 'c'}: Not a directory\n"


def test_a_bug_in_a_subcommand_is_one_line_that_says_how_to_see_it(small_ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    import tpload.offline

    def broken(*a: object, **k: object) -> list[str]:
        raise ValueError("a bug")
    monkeypatch.setattr(tpload.offline, "verify_checkpoint", broken)
    assert main(["verify", str(small_ckpt)]) == 1
    assert one_line(capsys.readouterr().err).startswith("tpload: error: unexpected ValueError: a bug (a bug in tpload; "
                                                        "TPLOAD_TRACEBACK=1 shows where)")
    monkeypatch.setenv("TPLOAD_TRACEBACK", "1")
    with pytest.raises(ValueError, match="a bug"):
        main(["verify", str(small_ckpt)])


def test_a_digest_store_that_is_a_file_is_refused_before_any_hashing(small_ckpt: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "store").write_text("x")
    for argv in ([str(small_ckpt), "--no-progress"], ["plan", str(small_ckpt), "--tp", "1", "--write"],
                 ["manifest", str(small_ckpt), "--hash", "blake3"]):
        assert main([*argv, "--digest-store", str(tmp_path / "store")]) == 1
        err = one_line(capsys.readouterr().err)
        assert f"--digest-store {tmp_path / 'store'}: {tmp_path / 'store'} is not a folder" in err, argv
        assert "hashed" not in err and "config" not in err  # refused before the checkpoint was even opened


def test_a_report_into_the_checkpoint_leaves_its_manifest_alone(ckpt_copy: Path, capsys: pytest.CaptureFixture) -> None:
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    before = manifest.read_bytes()
    assert main([str(ckpt_copy), "--no-progress", "--report", str(manifest)]) == 1
    err = one_line(capsys.readouterr().err)
    assert f"--report {manifest} is inside the checkpoint {ckpt_copy}" in err and manifest.read_bytes() == before


def test_a_bad_flag_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--log-level", "loud"])
    assert e.value.code == 2 and "argument --log-level: invalid choice: 'LOUD'" in one_line(capsys.readouterr().err)


def test_no_progress_s_help_describes_the_flag() -> None:
    from tpload.__main__ import _load_parser
    helps = {a.option_strings[0]: a.help for a in _load_parser()._actions if a.option_strings}
    assert helps["--no-progress"].startswith("turn off rank 0's progress")

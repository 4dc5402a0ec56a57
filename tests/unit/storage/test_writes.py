"""Every file tpload writes goes through one writer (storage/files.py's ``atomic_path``): a regular
file is replaced whole, and an existing path that is a FIFO, a device, a folder or a symlink (to
anything: ``/dev/stdout`` is one) is refused, untouched, with one line naming ``--report -``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tpload.attest.build import write as write_attestation
from tpload.cli import main
from tpload.storage.files import NotRegularTarget, atomic_write, target_problem


def planted(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a link to /dev/null, a link to a regular file and a broken link, each at a path a
    user could name as an output."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    null = tmp_path / "null"
    null.symlink_to("/dev/null")
    kept = tmp_path / "kept.json"
    kept.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(kept)
    broken = tmp_path / "broken.json"
    broken.symlink_to(tmp_path / "nowhere")
    return {"a FIFO": fifo, "a symlink to a device": null, "a symlink to a regular file": link,
            "a symlink to nothing": broken}  # fmt: skip


def unchanged(tmp_path: Path) -> None:
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert os.readlink(tmp_path / "null") == "/dev/null"
    assert os.readlink(tmp_path / "link.json") == str(tmp_path / "kept.json")
    assert (tmp_path / "kept.json").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_the_writer_refuses_every_path_that_is_not_a_regular_file(tmp_path: Path) -> None:
    for kind, path in planted(tmp_path).items():
        with pytest.raises(NotRegularTarget) as e:
            atomic_write(path, "{}")
        assert kind in e.value.strerror and "--report -" in e.value.strerror, e.value.strerror
        assert e.value.filename == str(path)
    with pytest.raises(NotRegularTarget, match="is a directory"):
        atomic_write(tmp_path, "{}")
    unchanged(tmp_path)


def test_the_writer_replaces_a_regular_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text("old")
    before = out.stat().st_ino
    atomic_write(out, "new")
    assert out.read_text() == "new" and out.stat().st_ino != before  # renamed in, not rewritten
    assert target_problem(out) is None and target_problem(tmp_path / "new.json") is None
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left


@pytest.mark.parametrize("flag", ["--report", "--attest"])
def test_the_command_line_refuses_an_output_that_is_not_a_regular_file_before_loading(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flag: str
) -> None:
    for kind, path in planted(tmp_path).items():
        assert main([str(small_ckpt), "--no-progress", flag, str(path)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"invalid option: {flag} {path} is {kind}" in err and "--report -" in err, err
        assert "load failed" not in err  # refused before the load
    unchanged(tmp_path)


def test_an_attestation_is_not_written_nor_its_signature_removed_beside_a_fifo(
    tmp_path: Path,
) -> None:
    out, sig = tmp_path / "a.json", tmp_path / "a.json.sig"
    os.mkfifo(sig)
    with pytest.raises(NotRegularTarget, match="a FIFO"):
        write_attestation(out, {"x": 1})
    assert stat.S_ISFIFO(os.lstat(sig).st_mode) and not out.exists()


def test_report_dash_writes_the_json_on_stdout_and_the_table_on_stderr(
    small_ckpt: Path, capfd: pytest.CaptureFixture
) -> None:
    assert main([str(small_ckpt), "--no-progress", "--report", "-"]) == 0
    out, err = capfd.readouterr()
    doc = json.loads(out)  # all of standard output is the report
    assert doc["ranks"][0]["tensors"] == 62 and doc["tp"] == 1
    assert "rank node" in err and "verified: 62 tensors by sha256" in err
    assert not Path("-").exists()


def test_attest_dash_is_refused_naming_a_file(
    small_ckpt: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([str(small_ckpt), "--no-progress", "--attest", "-"]) == 1
    err = capsys.readouterr().err
    assert "invalid option: --attest -: the attestation is written to a file" in err, err
    assert not Path("-").exists()

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
    assert main([str(tmp_path), "--no-progress"]) == 1  # a folder with no checkpoint in it
    err = capsys.readouterr().err
    assert (
        err.startswith("[rank 0] tpload: error: load failed on rank 0") and "Traceback" not in err
    )


def test_ctrl_c_exits_130_without_a_traceback(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import tpload.loading.sequence

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tpload.loading.sequence, "load_in", interrupted)
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
    from tpload.model.errors import LoadError

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
    from tpload.model.errors import LoadError

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


def test_synth_local_dir_lays_out_an_hf_download_that_loads_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--local-dir``: the files and huggingface_hub's own download metadata (read back by
    huggingface_hub as fresh, each etag what the hub gives the file), no manifest; it loads
    verified by the etags alone."""
    import hashlib

    import tpload

    hf_local = pytest.importorskip("huggingface_hub._local_folder")
    root = tmp_path / "dl"
    assert main(["synth", str(root), "--preset", "llama-tiny", "--local-dir"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {root}: 2 shards")
    files = sorted(p.name for p in root.iterdir() if p.is_file())
    assert files == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]  # no manifest: the etags vouch
    for name in files:
        data = (root / name).read_bytes()
        lfs = name.endswith(".safetensors")
        meta = hf_local.read_download_metadata(root, name)
        assert meta is not None and meta.etag == (
            hashlib.sha256(data).hexdigest()
            if lfs
            else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        )
    shards = tpload.load(root, progress=False)
    assert any(
        n.startswith("local-dir download (commit ")
        and "2 file(s) checked whole against their local-dir etags" in n
        for n in shards.report.notes
    ), shards.report.notes
    shards.release()
    with pytest.raises(SystemExit) as e:
        main(["synth", str(tmp_path / "x"), "--preset", "llama-tiny", "--local-dir", "--hub", "o"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_synth_of_a_gguf_preset_prints_the_step_its_load_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import shlex

    import tpload

    pytest.importorskip("gguf")
    root = tmp_path / "g"
    assert main(["synth", str(root), "--preset", "qwen3-moe-gguf-tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"wrote {root}: 2 GGUF files, preset qwen3-moe-gguf-tiny"
    step = out[1].removeprefix("next: ").split("   (")[0]
    assert step == f"python -m tpload manifest {root}", out
    with pytest.raises(tpload.LoadError, match="manifest missing"):
        tpload.load(root, progress=False)  # what the step is for
    assert main(shlex.split(step)[3:]) == 0  # the step as printed
    assert len(tpload.load(root / "model-00001-of-00002.gguf", progress=False).state_dict()) == 27
    local = tmp_path / "gl"  # laid out as a download instead: the etags vouch, no step to take
    assert main(["synth", str(local), "--preset", "qwen3-moe-gguf-tiny", "--local-dir"]) == 0
    assert "next:" not in capsys.readouterr().out
    notes = tpload.load(local / "model-00001-of-00002.gguf", progress=False).report.notes
    assert any("2 file(s) checked whole against their local-dir etags" in n for n in notes)


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
    readme = (Path(__file__).parents[3] / "README.md").read_text()
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
    assert set(clauses) == {0, 1, 2, 3, 130}
    assert "unknown flag" in clauses[2] and "on every rank" in clauses[1], clauses
    assert "`plan`" in clauses[3] and "--gpu-memory" in clauses[3]  # test_json_outputs runs it
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


# -- what a new user meets first (issue 28) ---------------------------------------------------


def test_several_ranks_asked_outside_torchrun_name_the_torchrun_line(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([str(small_ckpt), "--tp", "2", "--ep", "2", "--no-progress"]) == 1
    assert capsys.readouterr().err == (
        "[rank 0] tpload: error: --tp 2 --ep 2 needs 4 ranks, one process each, but this process "
        f"was not launched by torchrun; run: torchrun --nproc-per-node 4 -m tpload {small_ckpt} "
        "--tp 2 --ep 2 --no-progress\n"
    )


def test_a_missing_folder_is_one_line_a_node_and_exit_1_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import tpload.cli.output

    monkeypatch.setattr(tpload.cli.output, "QUIET_GRACE_S", 0.0)
    missing = tmp_path / "nowhere"
    files = {rank: tmp_path / f"error-{rank}.json" for rank in ("0", "1")}
    for rank, file in files.items():  # two ranks of one node, as torchrun starts them
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(file))
        assert main([str(missing)]) == 1
    line = f"[rank 0] tpload: error: {missing}: checkpoint directory does not exist"
    assert capsys.readouterr().err == line + "\n"
    docs = {rank: json.loads(file.read_text())["message"] for rank, file in files.items()}
    assert docs["0"]["message"] == line  # torchrun's summary quotes it as the root cause
    assert docs["1"]["message"] == (
        "[rank 1] tpload: refused before the load (see local rank 0)"
    ) and int(docs["1"]["extraInfo"]["timestamp"]) > int(docs["0"]["extraInfo"]["timestamp"])


def test_on_several_nodes_a_missing_folder_is_left_to_the_load_s_exchanged_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpload.cli.load import launch_problem
    from tpload.options.load_options import LoadOptions

    opts = LoadOptions(checkpoint=str(tmp_path / "nowhere"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # one node: every rank sees the same folder
    assert "checkpoint directory does not exist" in launch_problem(opts, [])
    # two nodes: the folder may be there on the other one, whose ranks would wait at the
    # rendezvous for ranks that never come; the load's check reaches every rank instead
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert launch_problem(opts, []) is None


def test_launch_mistakes_are_found_before_torch_is_imported(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from tpload.cli import main; rc = main(sys.argv[1:]); "
        "print(rc, 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    said = {}
    for argv in ([str(tmp_path / "nowhere")], [str(tmp_path), "--tp", "2"], ["verfy", "DIR"]):
        p = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).parents[3],
            timeout=120,
        )
        assert p.stdout.split() == ["1", "False"], (argv, p.stdout, p.stderr)
        said[argv[0]] = one_line(p.stderr)
    assert said["verfy"] == (
        "[rank 0] tpload: error: verfy: checkpoint directory does not exist; did you mean verify "
        "(a subcommand)?\n"
    )
    assert "this process was not launched by torchrun" in said[str(tmp_path)]


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "{x}"],
        ["plan", "{x}", "--tp", "1"],
        ["manifest", "{x}"],
        ["export", "{x}", "{out}", "--tp", "1"],
        ["attest", "verify", "{out}", "--checkpoint", "{x}"],
    ],
)
def test_a_subcommand_on_a_missing_folder_says_so_first(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    missing = tmp_path / "nowhere"
    argv = [a.format(x=missing, out=tmp_path / "out") for a in argv]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    # no config line about "the reference native layout" first: nothing is chosen for no folder
    assert out == "" and err == f"tpload: error: {missing}: checkpoint directory does not exist\n"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--tpp", "2"], "unrecognized arguments: --tpp 2; did you mean --tp?"),
        (
            ["DIR", "--kind", "expand"],
            "argument --kind: invalid choice: 'expand' (choose from packed, expanded); did you "
            "mean expanded?",
        ),
        (
            ["DIR", "--verify", "nodes"],
            "argument --verify: invalid choice: 'nodes' (choose from node, rank, digest, off); did "
            "you mean node?",
        ),
        (
            ["plan", "DIR", "--tp", "1", "--kind", "expand"],
            "(choose from packed, expanded); did you mean expanded?",
        ),
        (
            ["DIR", "--kindd", "packed", "--tpp", "2"],
            "unrecognized arguments: --kindd packed --tpp 2; --kindd: did you mean --kind?; --tpp: "
            "did you mean --tp?",
        ),
    ],
)
def test_a_mistyped_flag_or_choice_is_one_line_with_the_closest(
    argv: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = one_line(capsys.readouterr().err)
    assert e.value.code == 2 and said in err and "<Kind" not in err and "Verify." not in err


def test_a_bad_flag_on_a_node_s_other_ranks_exits_2_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import tpload.cli.output

    monkeypatch.setattr(tpload.cli.output, "QUIET_GRACE_S", 0.0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit) as e:
        main(["--tpp", "2"])
    assert e.value.code == 2 and capsys.readouterr().err == ""


def test_a_load_names_its_config_once(
    small_ckpt: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="tpload"):
        assert main([str(small_ckpt), "--no-progress"]) == 0
    said = capsys.readouterr().out + caplog.text
    assert said.count("so it is read as tpload's reference native layout") == 1, said


def test_manifest_prints_the_pin_that_a_load_then_accepts(
    ckpt_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    import hashlib

    assert main(["manifest", str(ckpt_copy), "--force"]) == 0
    out = capsys.readouterr().out.strip()
    sha = hashlib.sha256((ckpt_copy / "NATIVE_MANIFEST.json").read_bytes()).hexdigest()
    assert out == (
        f"wrote {ckpt_copy / 'NATIVE_MANIFEST.json'}; pin loads to it with --manifest-sha256 {sha}"
    )
    assert main(["verify", str(ckpt_copy), "--config", "none"]) == 0
    assert f"(pin loads to it with --manifest-sha256 {sha})" in capsys.readouterr().out
    assert main([str(ckpt_copy), "--no-progress", *out.split()[-2:]]) == 0  # the flag as printed


def test_plan_judges_the_peak_against_a_gpu_in_the_load_table_s_units(
    small_ckpt: Path, capsys: pytest.CaptureFixture
) -> None:
    import torch

    assert main(["plan", str(small_ckpt), "--tp", "2"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.split()[:2] == ["rank", "node"])
    assert "read GB" in head and "hash GB" in head  # bytes moved: GB, as the load table
    assert "device GiB" in head and "transient GiB" in head and "peak dev GiB" in head
    peak = float(re.search(r"peak device memory ([\d.]+) GiB", out).group(1))
    assert peak > 0 and re.search(r"peak RSS [\d.]+ GiB$", out.strip())
    if not torch.cuda.is_available():  # no GPU and no --gpu-memory: no size to judge against
        assert "fit" not in out
    assert main(["plan", str(small_ckpt), "--tp", "2", "--gpu-memory", "1"]) == 0
    fits = [line for line in capsys.readouterr().out.splitlines() if "fit" in line]
    assert fits == [
        f"fits a GPU of 1.00 GiB (--gpu-memory 1): the highest peak, rank 0's {peak:.3f} GiB, "
        f"leaves {1 - peak:.3f} GiB (a load's pre-flight checks the device's free memory less "
        "--reserve-gib)"
    ]
    assert main(["plan", str(small_ckpt), "--tp", "2", "--gpu-memory", "1e-6"]) == 3
    assert "does not fit a GPU of 0.00 GiB (--gpu-memory 1e-06): 2 of 2 ranks peak above it" in (
        capsys.readouterr().out
    )


def test_synth_s_help_says_which_presets_write_config_json(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "small, medium, seed: the reference native layout of docs/format.md (shards, index and "
        "NATIVE_MANIFEST.json; no config.json" in help_text
    )
    assert "NAME-tiny, deepseek-v3-deep, many-tensors: a published family's layout" in help_text
    assert main(["synth", str(tmp_path / "small")]) == 0
    assert main(["synth", str(tmp_path / "llama"), "--preset", "llama-tiny"]) == 0
    assert not (tmp_path / "small" / "config.json").exists()
    assert (tmp_path / "llama" / "config.json").is_file()


# -- progress (issue 28 item 7, 14) ------------------------------------------------------------

LINE = (
    r"{label} \d+/\d+ (tensors|files), [\d.]+/[\d.]+ GB, "
    r"([\d.]+ GB/s, ETA \d+ s|rate: measuring, ETA: measuring)"
)


def test_the_long_commands_show_the_load_s_progress_and_never_on_stdout(
    small_ckpt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import shutil

    import tpload.report.progress

    attestation = tmp_path / "att.json"
    assert main([str(small_ckpt), "--no-progress", "--attest", str(attestation)]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(small_ckpt, copy)
    # a line at every tensor: none of these takes the 2 s the first line waits for
    monkeypatch.setattr(tpload.report.progress, "EVERY_S", 0.0)
    runs = {
        "synth writing": ["synth", str(tmp_path / "s")],
        "manifest": ["manifest", str(copy), "--force"],
        "verify hash": ["verify", str(small_ckpt)],
        "export checking": ["export", str(small_ckpt), str(tmp_path / "x"), "--tp", "2"],
        "export writing rank": ["export", str(small_ckpt), str(tmp_path / "y"), "--tp", "2"],
        "plan --digest rank 1 of 2": ["plan", str(small_ckpt), "--tp", "2", "--digest"],
        "attest verify rank 0 of 1": [
            "attest",
            "verify",
            str(attestation),
            "--checkpoint",
            str(small_ckpt),
        ],
    }
    for label, argv in runs.items():
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level("INFO", logger="tpload"):
            assert main(argv) == 0, argv
        said = [r.getMessage() for r in caplog.records if r.name == "tpload"]
        pattern = LINE.format(label=re.escape(label) + r"\S*")
        assert any(re.fullmatch(pattern, m) for m in said), (label, said)
        assert "GB/s" not in capsys.readouterr().out, label


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise_both_on_stderr(
    small_ckpt: Path,
) -> None:
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios
    import threading

    code = (
        "import sys, tpload.report.progress as p; p.EVERY_S = 0.0; from tpload.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    argv = [sys.executable, "-c", code, "verify", str(small_ckpt), "--config", "none"]
    root = Path(__file__).parents[3]
    piped = subprocess.run(argv, capture_output=True, text=True, cwd=root, timeout=120)
    assert piped.returncode == 0 and "GB/s" not in piped.stdout
    assert re.search(LINE.format(label="verify hash"), piped.stderr), piped.stderr
    main_fd, term = pty.openpty()
    fcntl.ioctl(term, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a sized terminal
    shown = bytearray()

    def pump() -> None:
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=pump)
    reader.start()
    on_tty = subprocess.run(argv, stdout=subprocess.PIPE, stderr=term, cwd=root, timeout=120)
    os.close(term)
    reader.join(timeout=10)
    os.close(main_fd)
    text = shown.decode(errors="replace")
    assert on_tty.returncode == 0 and b"B/s" not in on_tty.stdout
    assert re.search(r"verify hash: +\d+%\|.*B/s\]", text), text  # tqdm's bar: rate, time left
    assert not re.search(r"tpload INFO verify hash \d+/", text)  # the bar, no counting lines
    assert "tpload INFO verify " in text  # the first line: what it does, before torch's import


def test_ctrl_c_during_a_load_says_interrupted_and_not_that_hashes_are_finishing(
    small_ckpt: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import tpload.report.progress as progress

    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="tpload"):
        assert main([str(small_ckpt)]) == 0  # a finished load ends its progress with the line
    assert "finishing the last hashes, then the ranks' verdict" in caplog.text
    caplog.clear()
    capsys.readouterr()
    real = progress.Progress.update_many  # update too: a batch of small tensors is one call
    told: list[int] = []

    def update_many(self: progress.Progress, nbytes: int, tensors: int) -> None:
        real(self, nbytes, tensors)
        if self.tensors >= 3:
            told.append(self.tensors)
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.Progress, "update_many", update_many)
    with caplog.at_level("INFO", logger="tpload"):  # mid-load: 130, as at any phase (README)
        assert main([str(small_ckpt)]) == 130
    err = capsys.readouterr().err
    assert f"[rank 0] read {told[0]}/" in caplog.text
    assert err.strip().splitlines() == [
        "[rank 0] tpload: interrupted (Ctrl-C) while reading; nothing was loaded"
    ]
    assert "finishing" not in caplog.text + err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["plan", "v3", "--tpp", "2"], "unrecognized arguments: --tpp 2; did you mean --tp?"),
        (["plan", "v3", "--tp", "2", "--gpu-memroy", "8"], "did you mean --gpu-memory?"),
        (["verify", "v3", "--treads", "2"], "did you mean --threads?"),
        (["manifest", "v3", "--forse"], "did you mean --force?"),
        (["export", "v3", "out", "--tp", "2", "--skp", "x"], "did you mean --skip?"),
        (["synth", "v3", "--prest", "small"], "did you mean --preset?"),
        (["bench", "--nprc", "2"], "did you mean --nproc?"),
        (["attest", "verify", "f", "--checkpint", "x"], "did you mean --checkpoint?"),
        (["attest", "v3"], "python -m tpload attest v3: no such action; the actions: verify"),
        (["attest", "verfy"], "no such action; the actions: verify; did you mean verify?"),
        (["v3", "--tpp", "2"], "unrecognized arguments: --tpp 2; did you mean --tp?"),
    ],
)
def test_every_parser_says_did_you_mean_in_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert said in err and "(usage: python -m tpload" in err, err


def test_verify_and_plan_on_an_empty_folder_say_only_that_it_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for argv in (["verify", str(tmp_path)], ["plan", str(tmp_path), "--tp", "1"]):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert "deepseek-v4-mtp" not in out + err and out == ""  # no note on how it would be read
        assert err == (
            f"tpload: error: {tmp_path}: no model.safetensors.index.json and no *.safetensors "
            "shard\n"
        )


def test_plan_and_verify_say_what_they_do_first(
    small_ckpt: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="tpload"):
        assert main(["plan", str(small_ckpt), "--tp", "2"]) == 0
        assert main(["verify", str(small_ckpt)]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "tpload"]
    assert said[0] == f"plan {small_ckpt} at tp 2 x ep 1: open, then plan (torch's import first)"
    assert f"verify {small_ckpt}: open, then hash every tensor (torch's import first)" in said


def test_attest_verify_takes_dir_as_an_argument_like_every_command(capsys) -> None:
    from tpload.cli import main

    for argv, words in (
        (["attest", "verify", "missing.json"], "attest verify needs DIR"),
        (["attest", "verify", "a.json", "one", "--checkpoint", "two"], "name two checkpoints"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert words in capsys.readouterr().err

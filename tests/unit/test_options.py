"""One options dataclass drives load()'s keywords and the command line; every value checked in one
place."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import typing
from dataclasses import fields
from pathlib import Path

import pytest

import tpload
from tpload.errors import LoadError, OptionsError
from tpload.options import (
    COUNT,
    GIB,
    RANKS,
    SECONDS,
    SEED,
    THREADS,
    LoadOptions,
    Parser,
    add_flags,
    from_args,
)


def cli(*argv: str) -> LoadOptions:
    p = Parser(prog="tpload")
    add_flags(p)
    return from_args(p.parse_args(list(argv)))


def test_defaults_are_the_documented_ones() -> None:
    o = LoadOptions()
    assert (o.kind, o.verify, o.ep, o.tp, o.samples, o.timeout_s) == (
        "packed",
        "node",
        1,
        None,
        4,
        600.0,
    )


def test_every_field_is_a_flag_and_a_keyword_with_its_help() -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    helps = {a.dest: a.help for a in p._actions if a.dest != "help"}
    for f in fields(LoadOptions):
        assert f.metadata["help"], f.name
        if f.metadata["cli"]:  # replica_group (a caller's own groups) is a load() keyword only
            assert helps.get(f.name) == f.metadata["help"]  # generated, not copied
        else:
            assert f.name not in helps
    params = inspect.signature(tpload.load).parameters
    assert {f.name for f in fields(LoadOptions)} - {"checkpoint"} <= set(params)
    assert (
        params["verify"].default == "node"
        and params["verify"].kind == inspect.Parameter.KEYWORD_ONLY
    )


def test_one_glob_is_one_glob_not_its_characters() -> None:
    assert LoadOptions.from_values({"skip": "mtp.*"}).skip == ("mtp.*",)
    assert LoadOptions.from_values({"defer": ["a", "b"]}).defer == ("a", "b")
    assert cli("--skip", "mtp.*", "--skip", "x").skip == ("mtp.*", "x")


@pytest.mark.parametrize(
    "values, needle",
    [
        (
            {"timeout_s": math.nan},
            "timeout_s= must be a finite number > 0 and at most 604800 (7 days), got nan",
        ),
        (
            {"timeout_s": math.inf},
            "timeout_s= must be a finite number > 0 and at most 604800 (7 days), got inf",
        ),
        ({"timeout_s": 0}, "timeout_s= must be > 0 and at most 604800 (7 days), got 0.0"),
        ({"timeout_s": 1e300}, "timeout_s= must be > 0 and at most 604800 (7 days), got 1e+300"),
        (
            {"timeout_s": 1e10},
            "timeout_s= must be > 0 and at most 604800 (7 days), got 10000000000.0",
        ),
        (
            {"reserve_gib": math.inf},
            "reserve_gib= must be a finite number between 0 and 1048576 (a PiB), got inf",
        ),
        (
            {"reserve_gib": math.nan},
            "reserve_gib= must be a finite number between 0 and 1048576 (a PiB), got nan",
        ),
        ({"reserve_gib": 1e300}, "reserve_gib= must be between 0 and 1048576 (a PiB), got 1e+300"),
        ({"hash_threads": 10**9}, "hash_threads= must be between 0 and 1024, got 1000000000"),
        ({"samples": -1}, "samples= must be between 0 and 16777216, got -1"),
        ({"tp": 100_000_000}, "tp= must be between 1 and 65536, got 100000000"),
        ({"ep": 0}, "ep= must be between 1 and 65536, got 0"),
        ({"kind": "fp8"}, "kind= 'fp8' is not one of packed, expanded"),
        ({"verify": "yes"}, "verify= 'yes' is not one of node, rank, digest, off"),
        ({"hash_threads": True}, "hash_threads=: expected an integer, got bool True"),
        ({"progress": "no"}, "progress=: expected True or False, got str 'no'"),
        ({"skip": 5}, "skip=: expected a glob or a list of globs, got int 5"),
        ({"manifest_sha256": "abc"}, "manifest_sha256= must be 64 hex digits"),
        ({"colour": 1}, "unknown option 'colour' (known: "),
    ],
)
def test_bad_values_are_named_as_the_caller_spelled_them(values: dict, needle: str) -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values(values)
    assert needle in str(e.value)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values({"timeout_s": math.nan, "samples": -1, "kind": "x"})
    assert str(e.value).startswith("3 invalid options:")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ("--timeout", "nan"),
            "argument --timeout: must be a finite number > 0 and at most 604800 (7 days), got nan",
        ),
        (
            ("--timeout", "1e300"),
            "argument --timeout: must be > 0 and at most 604800 (7 days), got 1e+300",
        ),
        (
            ("--timeout", "1e10"),
            "argument --timeout: must be > 0 and at most 604800 (7 days), got 10000000000.0",
        ),
        (
            ("--reserve-gib", "inf"),
            "argument --reserve-gib: must be a finite number between 0 and 1048576 (a PiB)",
        ),
        (
            ("--reserve-gib", "1e300"),
            "argument --reserve-gib: must be between 0 and 1048576 (a PiB), got 1e+300",
        ),
        (("--samples", "-2"), "argument --samples: must be between 0 and 16777216, got -2"),
        (
            ("--hash-threads", "1000000000"),
            "argument --hash-threads: must be between 0 and 1024, got 1000000000",
        ),
        (("--hash-threads", "two"), "argument --hash-threads: expected an integer, got 'two'"),
        (("--tp", "0"), "argument --tp: must be between 1 and 65536, got 0"),
    ],
)
def test_the_command_line_refuses_a_number_as_it_parses_it_in_one_line(
    argv: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as e:
        cli(*argv)
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and err.count("\n") == 1 and err.startswith("tpload: error: " + needle)
    ), err


def test_every_number_has_its_kind_s_one_rule() -> None:
    hints = typing.get_type_hints(LoadOptions)
    numeric = [
        f
        for f in fields(LoadOptions)
        if {int, float} & {hints[f.name], *typing.get_args(hints[f.name])}
    ]
    assert {f.name for f in numeric} == {
        "tp",
        "ep",
        "replicas",
        "hash_threads",
        "samples",
        "timeout_s",
        "reserve_gib",
    }
    assert {f.name: f.metadata["bound"] for f in numeric} == {
        "tp": RANKS,
        "ep": RANKS,
        "replicas": RANKS,
        "hash_threads": THREADS,
        "samples": COUNT,
        "timeout_s": SECONDS,
        "reserve_gib": GIB,
    }
    # the same rule at each end: parsed text and a keyword
    assert (
        SEED("4294967295") == 2**32 - 1
        and SEED.problem(-1) == "must be between 0 and 4294967295, got -1"
    )
    assert SECONDS("604800") == 604800.0 and SECONDS.problem(604801.0)
    assert THREADS("0") == 0 and THREADS.problem(1025)


def test_subcommand_numbers_use_the_same_rules(capsys: pytest.CaptureFixture) -> None:
    from tpload.__main__ import main

    for argv, needle in (
        (["synth", "x", "--seed", "-1"], "argument --seed: must be between 0 and 4294967295"),
        (
            ["plan", "x", "--tp", "1", "--nproc-per-node", "0"],
            "argument --nproc-per-node: must be between 1 and 65536, got 0",
        ),
        (
            ["export", "x", "y", "--tp", "1", "--hash-threads", "1000000000"],
            "argument --hash-threads: must be between 0 and 1024",
        ),
        (["verify", "x", "--threads", "5000"], "argument --threads: must be between 0 and 1024"),
        (["manifest", "x", "--threads", "-1"], "argument --threads: must be between 0 and 1024"),
        (["bench", "--timeout", "1e300"], "argument --timeout: must be > 0 and at most 604800"),
        (["bench", "--nproc", "0"], "argument --nproc: must be between 1 and 65536"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert (
            e.value.code == 2
            and err.count("\n") == 1
            and err.startswith("tpload: error: " + needle)
        ), (argv, err)


def test_a_report_into_a_missing_folder_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="folder .*nowhere does not exist"):
        LoadOptions.from_values({"report": str(tmp_path / "nowhere" / "r.json")})


def test_a_path_is_accepted_for_a_string() -> None:
    assert LoadOptions.from_values({"checkpoint": Path("/x")}).checkpoint == "/x"


def test_a_report_inside_the_checkpoint_is_refused_however_it_is_spelled(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    (tmp_path / "link").symlink_to(ckpt_copy)  # the folder through a symlink
    (tmp_path / "to-manifest").symlink_to(
        manifest
    )  # a report path that is a symlink to one of its files
    os.link(manifest, tmp_path / "hard")  # the same file under another name
    spellings = {
        manifest: "is inside the checkpoint",
        ckpt_copy / "new.json": "is inside the checkpoint",
        ckpt_copy / ".." / ckpt_copy.name / "r.json": "is inside the checkpoint",
        tmp_path / "link" / "r.json": "is inside the checkpoint",
        tmp_path / "to-manifest": "is inside the checkpoint",
        tmp_path / "hard": "is the checkpoint's NATIVE_MANIFEST.json",
    }
    for report, needle in spellings.items():
        with pytest.raises(OptionsError, match=f"report= {report} {needle}"):
            LoadOptions.from_values({"report": str(report), "checkpoint": ckpt_copy})
    LoadOptions.from_values(
        {"report": str(tmp_path / "r.json"), "checkpoint": ckpt_copy}
    )  # beside it: fine


def test_a_report_onto_a_hub_snapshot_s_blob_is_refused(tmp_path: Path) -> None:
    from tpload.__main__ import main

    assert (
        main(["synth", str(tmp_path / "hub"), "--preset", "deepseek-v3-tiny", "--hub", "org/m"])
        == 0
    )
    top = tmp_path / "hub" / "models--org--m"
    snap = next((top / "snapshots").iterdir())
    blob = (snap / "config.json").resolve()  # outside the snapshot folder, yet its config.json
    with pytest.raises(OptionsError, match=r"is the checkpoint's config\.json"):
        LoadOptions.from_values({"report": str(blob), "checkpoint": str(snap)})


def test_load_refuses_a_report_into_its_checkpoint_before_reading(small_ckpt: Path) -> None:
    manifest = small_ckpt / "NATIVE_MANIFEST.json"
    before = manifest.read_bytes()
    with pytest.raises(LoadError, match="the report never writes into the checkpoint it loads"):
        tpload.load(small_ckpt, report=str(manifest), progress=False)
    assert manifest.read_bytes() == before


@pytest.mark.parametrize(
    "store, needle",
    [
        ("file", "file is not a folder"),
        ("file/sub", "file is a file, so the folder cannot be made"),
    ],
)
def test_a_digest_store_that_cannot_be_a_folder_is_refused_first(
    tmp_path: Path, store: str, needle: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        OptionsError, match=f"digest_store= {tmp_path / store}: {tmp_path / needle}"
    ):
        LoadOptions.from_values({"digest_store": str(tmp_path / store)})
    LoadOptions.from_values(
        {"digest_store": str(tmp_path / "new" / "store")}
    )  # made when first written

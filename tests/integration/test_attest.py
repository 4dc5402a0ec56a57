"""A load attestation written by a real tp 2 launch (rank 0, after the verdict, signed with an EC
key the test makes) is checked by `tpload attest verify`: it verifies against the checkpoint with
the signer's key, fails with another key, and a forged copy fails with one line per difference."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tpload.cli import main
from tpload.tools.published import write_published

from ..ckpt_tools import ec_keypair
from ..helpers import torchrun, tpload_cli

GONE = str(Path(__file__).resolve().parents[1] / "workers" / "attest_gone.py")

pytest.importorskip("model_signing")


def test_a_tp2_load_attests_what_each_rank_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    ckpt = write_published(tmp_path / "ckpt", "deepseek-v3-tiny")
    (signer, signer_pub), (_, stranger_pub) = (
        ec_keypair(tmp_path, "signer"),
        ec_keypair(tmp_path, "stranger"),
    )
    out, report = tmp_path / "attestation.json", tmp_path / "report.json"
    run = tpload_cli(
        2,
        "--checkpoint",
        str(ckpt),
        "--attest",
        str(out),
        "--attest-key",
        str(signer),
        "--report",
        str(report),
    )
    assert run.rc == 0, run.text
    assert (
        "wrote the load attestation" in run.text and out.is_file() and Path(f"{out}.sig").is_file()
    )
    doc = json.loads(out.read_text())
    ranks = json.loads(report.read_text())["ranks"]
    # the statement carries the exchanged table's digests, nodes and devices
    assert [(r["digest"], r["node"], r["device"]) for r in doc["predicate"]["ranks"]] == [
        (r["digest"], r["node"], "cpu") for r in ranks
    ]
    assert (
        doc["predicate"]["options"]["tp"] == 2 and doc["predicate"]["options"]["verify"] == "node"
    )

    capsys.readouterr()
    assert (
        main(["attest", "verify", str(out), "--checkpoint", str(ckpt), "--key", str(signer_pub)])
        == 0
    )
    assert (
        "OK: every rank's windows, digest and the coverage match the checkpoint, signature verified"
        in capsys.readouterr().out
    )
    assert (
        main(["attest", "verify", str(out), "--checkpoint", str(ckpt), "--key", str(stranger_pub)])
        == 1
    )
    lines = capsys.readouterr().out.splitlines()
    mismatch = (
        f"DIFFERS {out}.sig: does not verify with the key {stranger_pub}: Key mismatch: The "
        "public key hash in the signature's verification material does not match the provided "
        "public key."
    )
    assert [line for line in lines if line.startswith("DIFFERS")] == [mismatch]

    # forged: rank 1 claims rank 0's window of a split tensor, and rank 0's digest is changed
    ranks0, ranks1 = doc["predicate"]["ranks"]
    name = next(
        n for n, w in ranks1["windows"].items() if ranks0["windows"].get(n) not in (None, w)
    )
    ranks1["windows"][name] = ranks0["windows"][name]
    ranks0["digest"] = "f" * 64
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))
    assert main(["attest", "verify", str(forged), "--checkpoint", str(ckpt)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("DIFFERS")]
    assert len(lines) == 2, lines
    assert (
        lines[0].startswith(f"DIFFERS rank 1: tensor {name}: attested rows")
        and "the plan's window is" in lines[0]
    )
    assert lines[1].startswith("DIFFERS rank 0: digest attested ffffffffffffffff...")


def test_attest_is_refused_with_verify_off(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # refused before any world or checkpoint is touched: nothing was checked, so nothing can be
    # attested
    assert (
        main(
            ["--checkpoint", str(tmp_path), "--verify", "off", "--attest", str(tmp_path / "a.json")]
        )
        == 1
    )
    assert (
        "nothing to attest with --verify off" in capsys.readouterr().err
        and not (tmp_path / "a.json").exists()
    )


def test_a_failed_attestation_write_fails_every_rank(tmp_path: Path) -> None:
    """The folder of --attest FILE disappears while the load runs (rank 0 removes it): the write
    after the passed verdict fails on rank 0, and every rank fails with rank 0's reason: no rank
    returns weights (a split verdict would let rank 1 serve while no statement exists)."""
    ckpt = write_published(tmp_path / "ckpt", "gpt-oss-tiny")
    out = tmp_path / "attest" / "a.json"
    out.parent.mkdir()
    run = torchrun(2, [GONE, str(ckpt), str(out)])
    assert run.rc != 0, run.text
    # Both ranks print to one pipe: cut at each "rank N: " so two lines written together still
    # read as two (seen under load).
    lines = sorted(p.strip() for p in re.split(r"(?=rank \d: )", run.out) if p.startswith("rank "))
    assert len(lines) == 2 and not any(": weights " in line for line in lines), run.text
    want = (
        f"failed: the load passed, but rank 0 could not write the load attestation {out} (No such "
        "file or directory); no rank returned weights"
    )
    assert lines[0].startswith(f"rank 0: {want}") and lines[1].startswith(f"rank 1: {want}"), lines
    assert not out.exists()


def test_the_docs_example_runs_as_written(tmp_path: Path) -> None:
    """docs/attestation.md's "Try it" block, line by line in a scratch folder: the key made by
    openssl, a real torchrun launch that attests and signs, attest verify with the public key."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("openssl") is None or shutil.which("torchrun") is None:
        pytest.skip("needs openssl and torchrun on PATH")
    page = (Path(__file__).parents[2] / "docs" / "attestation.md").read_text()
    block = re.search(r"## Try it\n.*?```bash\n(.*?)```", page, re.S).group(1)
    lines = [line.split("   #")[0].strip() for line in block.splitlines() if line.strip()]
    assert lines[0].startswith("openssl ecparam")
    assert lines[-1].startswith("python -m tpload attest")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(Path(__file__).parents[2]),  # this checkout's tpload
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    for line in lines:
        run = subprocess.run(
            line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, (line, run.stdout, run.stderr)
    said = " ".join(page.split("The last line prints `", 1)[1].split("`", 1)[0].split())
    assert run.stdout.strip() == said, run.stdout

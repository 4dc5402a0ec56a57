"""Test helpers: a real torchrun launcher and byte-level checkpoint surgery (no tpload code)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass
class Run:
    rc: int
    out: str
    err: str
    seconds: float = 0.0
    rank_err: dict[int, str] | None = None
    """Each rank's own stderr (when the run was asked to keep per-rank logs)."""

    @property
    def text(self) -> str:
        return self.out + self.err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    nproc: int,
    args: list[str],
    *,
    timeout: float = 120,
    env: dict | None = None,
    logs: Path | None = None,
) -> Run:
    """A real ``torchrun`` (gloo, CPU) of ``args`` (``-m module`` or a script, then its args).

    With ``logs``, each rank's stderr is kept apart (torchrun --redirects) and returned.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--max-restarts",
        "0",
    ]
    if logs is not None:
        cmd += ["--log-dir", str(logs), "--redirects", "2"]
    # PYTHONPATH pins the workers to the tpload of this checkout, whatever is installed.
    e = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(HERE.parent),
    )
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout, env=e)
    run = Run(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    if logs is not None:
        run.rank_err = {
            int(f.parent.name): f.read_text() for f in logs.glob("*/attempt_0/*/stderr.log")
        }
    return run


def tpload_cli(
    nproc: int, *flags: str, timeout: float = 120, env: dict | None = None, logs: Path | None = None
) -> Run:
    return torchrun(
        nproc, ["-m", "tpload", "--no-progress", *flags], timeout=timeout, env=env, logs=logs
    )


def error_of(text: str, rank: int | None = None) -> str:
    """The full message printed after ``[rank R] tpload: error:`` (by ``rank``, or by any rank when
    None), to the end of ``text``; empty when none. A verdict every rank holds is printed in full by
    one rank only: :func:`load_error` finds it and checks the others' pointers."""
    found = re.search(rf"\[rank {rank if rank is not None else '[0-9]+'}\] tpload: error: ", text)
    return text[found.end() :].strip() if found else ""


def load_error(run: Run) -> tuple[int, str]:
    """(reporter, message) of a failed load run with per-rank logs: exactly one rank printed the
    message in full, and every other rank only ``[rank R] tpload: load failed (see rank
    reporter)``."""
    assert run.rank_err is not None, "run with logs= to keep each rank's stderr"
    full = {r: error_of(text, r) for r, text in run.rank_err.items() if error_of(text, r)}
    assert len(full) == 1, (
        f"expected the message from one rank, got it from {sorted(full)}: {run.rank_err}"
    )
    ((reporter, message),) = full.items()
    for r, text in run.rank_err.items():
        if r != reporter:
            assert f"[rank {r}] tpload: load failed (see rank {reporter})\n" in text, (r, text)
    return reporter, message


def tensor_offset(root: Path, name: str) -> tuple[Path, int, int]:
    """(shard path, absolute offset, nbytes) of a tensor, read independently of tpload."""
    file = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][name]
    path = root / file
    with open(path, "rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(hlen))
    b, e = header[name]["data_offsets"]
    return path, 8 + hlen + b, e - b


def poke(
    root: Path, name: str, index: int, value: int | None = None, *, fix_manifest: bool = False
) -> int:
    """Set (or bit-flip) byte ``index`` of tensor ``name``; optionally re-hash it in the
    manifest."""
    path, off, n = tensor_offset(root, name)
    with open(path, "r+b") as f:
        f.seek(off + index)
        old = f.read(1)[0]
        f.seek(off + index)
        f.write(bytes([value if value is not None else old ^ 0x01]))
        if fix_manifest:
            f.seek(off)
            digest = hashlib.sha256(f.read(n)).hexdigest()
    if fix_manifest:
        m = json.loads((root / "NATIVE_MANIFEST.json").read_text())
        m["tensors"][name]["sha256"] = digest
        (root / "NATIVE_MANIFEST.json").write_text(json.dumps(m))
    return old


def rewrite_header(root: Path, file: str, mutate) -> None:
    """Rewrite one shard's JSON header through ``mutate(header)``, keeping its data bytes."""
    path = root / file
    raw = path.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + hlen])
    mutate(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + hlen :])


def edit_json(path: Path, mutate) -> None:
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))


def shard_of(root: Path, name: str) -> str:
    return json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][name]


SLOW_WORKER = HERE / "workers" / "slow.py"


def interrupted_run(
    cmd: list[str], mark: Path, *, env: dict | None = None, after_s: float = 0.5
) -> Run:
    """Run ``cmd`` (tests/workers/slow.py's, whose slowed ranks create ``mark.RANK`` when their
    loop reads its first tensor) in a session of its own, and send its whole process group SIGINT
    ``after_s`` seconds after the first mark appears: what Ctrl-C in a terminal does."""
    import signal

    e = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(HERE.parent),
        SLOW_MARK=str(mark),
    )
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd,
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        while not list(mark.parent.glob(f"{mark.name}.*")):
            if p.poll() is not None or time.monotonic() - t0 > 90:
                break
            time.sleep(0.05)
        time.sleep(after_s)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    return Run(p.returncode, out, err, time.monotonic() - t0)


def torchrun_cmd(nproc: int) -> list[str]:
    """torchrun's command line as :func:`torchrun` runs it (a free port, no restarts)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--max-restarts",
        "0",
    ]

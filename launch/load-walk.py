"""Following the storage through a plain load: how many of tpload's files it enters, and how often
it goes back and forth between the floors (docs/architecture.md), counted on rank 0 of a real
``torchrun --nproc-per-node N -m tpload`` by a ``sys.setprofile`` trace.

    python launch/load-walk.py [CHECKPOINT] [--nproc 2] [--storage] [--json]

With no checkpoint, the built-in default (what ``python -m tpload`` loads; run it once first, so
its writing is not in the walk). The walk is every call into tpload's functions (a module's import
is not a call); ``--storage`` keeps the calls that are handed the load's storage (an argument, or
``self``, that is a ``StorageBase``). Printed, with the floors from pyproject.toml's layers
contract:

* ``files``: distinct tpload modules the walk enters, and the packages they are in;
* ``climbs``: calls from a module into one on a higher floor than its own (a lower floor asking an
  upper one back: a callback, a Protocol's implementation);
* ``returns``: calls into a package the walk had already left for another (the walk going back
  and forth);
* ``calls``: the calls counted.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tpload"


def floors() -> dict[str, int]:
    """Each package's floor, 0 the top (pyproject.toml's ``layers`` contract)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in doc["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    return {
        name.strip(): i for i, layer in enumerate(contract["layers"]) for name in layer.split("|")
    }


class Walk:
    def __init__(self, storage: bool) -> None:
        from tpload.storage.base import StorageBase

        self.storage_type, self.storage, self.floors = StorageBase, storage, floors()
        self.files: set[str] = set()
        self.calls = self.climbs = self.returns = 0
        self.climbed: dict[str, int] = {}
        """Each climb, as "caller function -> callee function", and how often."""
        self.left: set[str] = set()
        self.here = ""
        self.lock = threading.Lock()

    def package(self, filename: str) -> str | None:
        """The tpload package of a file (``api`` for tpload/api.py), or None outside tpload."""
        try:
            rel = Path(filename).resolve().relative_to(PACKAGE)
        except ValueError:
            return None
        return rel.parts[0].removesuffix(".py")

    def follows(self, frame: FrameType) -> bool:
        if frame.f_code.co_name == "<module>":  # an import, not a step of the walk
            return False
        if not self.storage:
            return True
        return any(isinstance(v, self.storage_type) for v in frame.f_locals.values())

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = self.package(frame.f_code.co_filename)
        if callee is None or not self.follows(frame):
            return
        caller = self.package(frame.f_back.f_code.co_filename) if frame.f_back else None
        with self.lock:
            self.calls += 1
            self.files.add(str(Path(frame.f_code.co_filename).resolve().relative_to(ROOT)))
            top = self.floors.get(callee, len(self.floors))
            if caller is not None and top < self.floors.get(caller, len(self.floors)):
                self.climbs += 1
                back = frame.f_back
                assert back is not None  # noqa: S101 - a caller was found
                where = f"{caller}.{back.f_code.co_qualname} -> {callee}.{frame.f_code.co_qualname}"
                self.climbed[where] = self.climbed.get(where, 0) + 1
            if callee != self.here:
                if callee in self.left:
                    self.returns += 1
                if self.here:
                    self.left.add(self.here)
                self.here = callee

    def figures(self) -> dict[str, object]:
        packages = sorted({f.split("/")[1].removesuffix(".py") for f in self.files})
        return {
            "files": len(self.files),
            "packages": len(packages),
            "climbs": self.climbs,
            "returns": self.returns,
            "calls": self.calls,
            "package_names": packages,
            "climbed": dict(sorted(self.climbed.items(), key=lambda kv: -kv[1])),
        }


def worker(out: str, storage: bool, argv: list[str]) -> None:
    """Rank 0 traced while it runs ``python -m tpload ARGV`` (the others run it plainly)."""
    sys.argv = ["tpload", *argv]
    walk = Walk(storage) if os.environ.get("RANK") == "0" else None
    if walk is not None:
        threading.setprofile(walk)
        sys.setprofile(walk)
    code = 0
    try:
        runpy.run_module("tpload", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        if walk is not None:
            sys.setprofile(None)
            threading.setprofile(None)
            Path(out).write_text(json.dumps(walk.figures()))
    sys.exit(code)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", default="")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--storage", action="store_true", help="only the calls handed the storage")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--climbs", action="store_true", help="list the climbs, most frequent first")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a, rest = p.parse_known_args()
    if a.worker:
        worker(a.worker, a.storage, [x for x in [a.checkpoint, *rest] if x])
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"load-walk-{os.getpid()}.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(a.nproc), __file__, "--worker", str(out),
        *(["--storage"] if a.storage else []), *([a.checkpoint] if a.checkpoint else []), *rest,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0 or not out.exists():
        sys.exit(f"the load failed ({run.returncode}):\n{run.stderr[-3000:]}")
    figures = json.loads(out.read_text())
    out.unlink()
    if a.json:
        print(json.dumps(figures))
        return
    what = "the calls handed the storage" if a.storage else "every call into tpload"
    print(
        f"{what}: {figures['calls']} calls, {figures['files']} files in "
        f"{figures['packages']} packages ({', '.join(figures['package_names'])}), "
        f"{figures['climbs']} climbs, {figures['returns']} returns to a package already left"
    )
    if a.climbs:
        for where, n in figures["climbed"].items():
            print(f"{n:6d}  {where}")


if __name__ == "__main__":
    main()

"""Checks that need no GPU and no world: predicted digests and offline verification.

* ``tpload plan DIR --digest`` runs every rank's plan through the same
  :func:`tpload.load.run` on the CPU, one rank at a time, so the digests it
  prints are exactly what a load on any device must produce; ``--write``
  keeps them in TPLOAD_DIGESTS.json beside the checkpoint, and every later
  load with that layout, kind and config is checked against them.
* ``tpload verify DIR`` checks a checkpoint at rest and lists every bad tensor.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from . import formats
from .checkpoint import Checkpoint
from .config import Config
from .errors import LoadError
from .load import run
from .plan import Layout, Planner, RankPlan
from .report import Progress

PREDICTIONS_NAME = "TPLOAD_DIGESTS.json"


def config_id(config: Config) -> str:
    """A short hash of what a config decides (rules and layout constants, not its file name)."""
    rules = [{k: v for k, v in asdict(r).items() if k != "index"} for r in config.rules]
    doc = json.dumps({"rules": rules, "align": config.channel_align, "experts": config.expert_pattern}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:12]


def layout_key(config: Config, layout: Layout, kind: str) -> str:
    return f"tp{layout.tp}-ep{layout.ep}-{kind}-config-{config_id(config)}"


def predict(planner: Planner, layout: Layout, kind: str) -> list[str]:
    """Every rank's digest for this layout and kind, computed on the CPU by the load's own code."""
    out = []
    for rank in range(layout.world):
        plan = planner.plan(layout, kind, rank)
        result = run(planner.ckpt, plan, device=torch.device("cpu"), to_hash=[], hash_threads=1,
                     samples_per_role=0, progress=Progress(0, 0, enabled=False))
        out.append(result.digest())
        del result  # one rank's arena at a time
    return out


def read_predictions(root: Path) -> dict[str, list[str]]:
    path = root / PREDICTIONS_NAME
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {k: list(v) for k, v in doc["layouts"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LoadError(f"{path}: stored digest predictions are unreadable ({e}); remove it or rewrite it "
                        "with `python -m tpload plan DIR --digest --write`") from None


def write_predictions(root: Path, key: str, digests: list[str]) -> Path:
    layouts = read_predictions(root)
    layouts[key] = digests
    path = root / PREDICTIONS_NAME
    path.write_text(json.dumps({"format": 1, "layouts": layouts}, indent=1) + "\n")
    return path


def check_predictions(root: Path, key: str, digests: list[str]) -> tuple[bool, list[str]]:
    """(found, problems): compare every rank's digest with the stored prediction for ``key``."""
    want = read_predictions(root).get(key)
    if want is None:
        return False, []
    if len(want) != len(digests):
        return True, [f"{root / PREDICTIONS_NAME}: {key} predicts {len(want)} ranks, the load has {len(digests)}"]
    return True, [f"rank {r}: digest {got[:16]}... differs from the prediction {exp[:16]}... in {root / PREDICTIONS_NAME} "
                  f"({key}): its device memory does not hold the reference decode"
                  for r, (got, exp) in enumerate(zip(digests, want)) if got != exp]


def plan_rows(planner: Planner, layout: Layout, kind: str) -> list[RankPlan]:
    return [planner.plan(layout, kind, r) for r in range(layout.world)]


# -- offline verification -------------------------------------------------------------------------

def verify_checkpoint(root: Path, config: Config | None, *, threads: int = 4) -> list[str]:
    """Every problem with the checkpoint at rest: headers, manifest, sha256, scale bytes, NaN codes."""
    try:
        ckpt = Checkpoint(root)
    except LoadError as e:
        return [str(e)]
    names = ckpt.names()
    problems = ckpt.manifest_problems(names)
    if ckpt.manifest is None:
        return problems
    problems += [f"{root}: manifest names {n}, which no shard holds" for n in sorted(set(ckpt.manifest) - set(names))]
    problems += ckpt.hash_problems([n for n in names if n in ckpt.manifest], threads=threads)
    if config is not None:
        problems += _value_problems(ckpt, config)
    return problems


def _value_problems(ckpt: Checkpoint, config: Config) -> list[str]:
    """Scale bytes and NaN codes, by role (needs a config that fits the checkpoint)."""
    try:
        planner = Planner(ckpt, config)
    except LoadError as e:
        return [f"config {config.name} does not fit: {e}"]
    problems = []
    for e in planner.entries:
        if e.scale is not None and e.scale.dtype != "F32":
            n = int(formats.count_bad_e8m0(torch.from_numpy(ckpt.raw(e.scale.name))))
            if n:
                problems.append(f"{e.scale.path}: tensor {e.scale.name}: {n} E8M0 scale bytes 0x00/0xFF (expected 1..254)")
        if e.rule.role == "fp8":
            n = int(formats.count_bad_e4m3(torch.from_numpy(ckpt.raw(e.name))))
            if n:
                problems.append(f"{e.info.path}: tensor {e.name}: {n} E4M3 NaN codes 0x7F/0xFF")
    return problems

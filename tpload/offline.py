"""Checks that need no GPU and no world: predicted digests and offline verification.

* ``tpload plan DIR --digest`` runs every rank's plan through the same
  :func:`tpload.load.run` on the CPU, one rank at a time, so the digests it
  prints are exactly what a load on any device must produce; ``--write``
  first checks every tensor the layout uses by sha256 against the manifest,
  then keeps the digests in TPLOAD_DIGESTS.json beside the checkpoint with a
  stamp of what they were verified against (the manifest's sha256, each
  shard's size and mtime). Every later load with that layout, kind and
  config is checked against them, and ``--verify digest`` loads trust them
  in place of hashing: see :func:`verified_prediction`.
* ``tpload verify DIR`` checks a checkpoint at rest and lists every bad tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import formats
from .checkpoint import MANIFEST_NAME, Checkpoint
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


@dataclass(frozen=True)
class Prediction:
    """One layout's stored digests, and what they were verified against (None: not verified)."""

    digests: list[str]
    stamp: dict | None = None


def checkpoint_stamp(ckpt: Checkpoint) -> dict:
    """What a verified prediction vouches for: the manifest's sha256 and each shard's size and mtime.

    A shard rewritten since (even with the same bytes) or a new manifest makes
    the prediction stale; ``--verify digest`` then refuses to trust it.
    """
    manifest = hashlib.sha256((ckpt.root / MANIFEST_NAME).read_bytes()).hexdigest()
    shards = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(ckpt.shard_paths())}
    return {"manifest_sha256": manifest, "shards": shards}


def predict(planner: Planner, layout: Layout, kind: str, *, verify: bool = False) -> list[str]:
    """Every rank's digest for this layout and kind, computed on the CPU by the load's own code.

    ``verify``: first hash every tensor the layout uses against the manifest
    (each once); any mismatch raises :class:`LoadError`, listing them all.
    """
    out, hashed = [], set()
    for rank in range(layout.world):
        plan = planner.plan(layout, kind, rank)
        to_hash = [n for n in plan.used_tensors if n not in hashed] if verify else []
        if verify:
            planner.ckpt.check_manifest(sorted(plan.used_tensors))
        hashed.update(to_hash)
        result = run(planner.ckpt, plan, device=torch.device("cpu"), to_hash=to_hash, hash_threads=2,
                     samples_per_role=0, progress=Progress(0, 0, enabled=False), spare_cores=(os.cpu_count() or 1) - 1)
        out.append(result.digest())
        del result  # one rank's arena at a time
    return out


def record_verified(planner: Planner, layout: Layout, kind: str) -> tuple[list[str], Path]:
    """``tpload plan --write``: hash every tensor the layout uses, then store every rank's digest
    stamped with what was verified (raises LoadError listing every mismatch; nothing is written then)."""
    digests = predict(planner, layout, kind, verify=True)
    path = write_predictions(planner.ckpt.root, layout_key(planner.config, layout, kind), digests,
                             checkpoint_stamp(planner.ckpt))
    return digests, path


def read_predictions(root: Path) -> dict[str, Prediction]:
    path = root / PREDICTIONS_NAME
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {k: Prediction(list(v)) if isinstance(v, list) else Prediction(list(v["digests"]), v.get("verified"))
                for k, v in doc["layouts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LoadError(f"{path}: stored digest predictions are unreadable ({e}); remove it or rewrite it "
                        "with `python -m tpload plan DIR --digest --write`") from None


def write_predictions(root: Path, key: str, digests: list[str], stamp: dict | None = None) -> Path:
    """Store ``digests`` for ``key`` (with the stamp of a sha256 verification when there was one)."""
    layouts = {k: {"digests": v.digests, "verified": v.stamp} for k, v in read_predictions(root).items()}
    layouts[key] = {"digests": digests, "verified": stamp}
    path = root / PREDICTIONS_NAME
    path.write_text(json.dumps({"format": 2, "layouts": layouts}, indent=1) + "\n")
    return path


def check_predictions(root: Path, key: str, digests: list[str]) -> tuple[bool, list[str]]:
    """(found, problems): compare every rank's digest with the stored prediction for ``key``."""
    stored = read_predictions(root).get(key)
    if stored is None:
        return False, []
    want = stored.digests
    if len(want) != len(digests):
        return True, [f"{root / PREDICTIONS_NAME}: {key} predicts {len(want)} ranks, the load has {len(digests)}"]
    return True, [f"rank {r}: digest {got[:16]}... differs from the prediction {exp[:16]}... in {root / PREDICTIONS_NAME} "
                  f"({key}): its device memory does not hold the reference decode"
                  for r, (got, exp) in enumerate(zip(digests, want)) if got != exp]


def verified_prediction(ckpt: Checkpoint, key: str, *, fix: str) -> Prediction:
    """The stored prediction a ``--verify digest`` load may trust in place of sha256, or LoadError saying why not.

    Trusted only if ``tpload plan --write`` verified it by sha256 and nothing
    it was verified against has changed since (:func:`checkpoint_stamp`).
    ``fix`` (the command that writes it) ends each message.
    """
    path = ckpt.root / PREDICTIONS_NAME
    stored = read_predictions(ckpt.root).get(key)
    if stored is None or stored.stamp is None:
        what = "no prediction" if stored is None else "only an unverified prediction (format 1)"
        raise LoadError(f"--verify digest: {path} holds {what} for {key}; {fix}")
    now = checkpoint_stamp(ckpt)
    changed = [f"shard {name}" for name in sorted(set(now["shards"]) | set(stored.stamp.get("shards", {})))
               if now["shards"].get(name) != stored.stamp.get("shards", {}).get(name)]
    if now["manifest_sha256"] != stored.stamp.get("manifest_sha256"):
        changed.insert(0, MANIFEST_NAME)
    if changed:
        raise LoadError(f"--verify digest: {', '.join(changed)} changed (size or mtime) since the digests in {path} "
                        f"were verified ({key}); {fix}")
    return stored


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

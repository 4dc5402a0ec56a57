"""The load attestation: an exit path of the gate that carries no bytes, only what they were.

After a passed verdict, ``--attest FILE`` makes rank 0 write an in-toto statement
(docs/attestation.md): its subject is the checkpoint's identity (a signature bundle's sha256, the
manifest's sha256, or each file's whole-file digest when the folder is vouched for file by file),
its predicate the trust source that vouched (model/trust.py) and every
rank's node, device, digest and windows (boxes of the stored tensors' 2-D byte views, as the plan
cuts them), with the coverage that follows: for every tensor of the checkpoint, how many ranks serve
each of its bytes (at least one; skipped and deferred tensors listed as such). Rank 0 derives every
rank's plan from the catalogue the load planned with (the planner is deterministic), so no
collective gathers the windows; the one small collective after the write only tells every rank
whether it succeeded (:func:`after_verdict`, which the door calls: a failed write fails every
rank).

Building the statement is this module's job; checking one, ``tpload attest verify``, is
:mod:`tpload.attest.check`'s, and signing it (``--attest-key``) is
:mod:`tpload.attest.signing`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast  # Any: a statement's JSON values

from .. import __version__
from ..distributed.exchange import agree
from ..distributed.placement import Placement, position
from ..loading.sequence import Loaded
from ..model.errors import LoadError
from ..model.figures import RankFigures
from ..model.text import escape_name
from ..model.trust import TrustSource
from ..model.values import JsonObject, Layout
from ..options.load_options import LoadOptions
from ..planning.planner import Planner, RankPlan
from ..report.log import rank_log
from ..selection.config import ACTIVATION_ORIGIN, Config
from ..storage.catalogue import Catalogue
from ..storage.files import NotRegularTarget, atomic_write, target_problem
from ..verification.gate import Verdict
from ..verification.strategy import Strategy
from .signing import sign, signature_path

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tpload.dev/load-attestation/v1"

Window = list[int]
"""[first row, end row, first byte column, end byte column) of a stored tensor's 2-D byte view."""


# -- what a load serves -------------------------------------------------------------------------


def windows(plan: RankPlan) -> dict[str, Window]:
    """Every stored tensor this rank reads a window of, and the window (from ``RankPlan.reads``)."""
    return {
        n: [int(rows[0]), int(rows[1]), int(cols[0]), int(cols[1])]
        for n, (rows, cols) in plan.reads.items()
    }


def views(plans: Sequence[RankPlan]) -> dict[str, list[int]]:
    """Each read tensor's 2-D byte view, [rows, row bytes], that its windows are boxes of. Read from
    the plans' compact entries as ``RankPlan.reads`` reads its boxes (a cut's fields after its name:
    rows, cols, shape, dtype, view): making every rank's items would cost far more at 64 ranks of a
    DeepSeek-V3-sized checkpoint."""
    out: dict[str, list[int]] = {}
    for plan in plans:
        for e, s in zip(plan.entries, plan.shapes, strict=True):  # parallel columns of one plan
            if e.name in out:
                continue
            f = e.fit
            for meta, cut in ((f.scale, s.scale), (f.scale2, s.scale2), (f.weight, s.weight)):
                if cut is not None and meta is not None:  # (a cut: its tensor)
                    out[meta.name] = [int(cut[4][0]), int(cut[4][1])]
    return out


def replicas(view: Sequence[int], boxes: Sequence[Window]) -> tuple[int, int]:
    """(fewest, most) boxes covering any byte of a ``view``-sized grid; boxes are clipped to it."""
    rows, cols = int(view[0]), int(view[1])
    if rows <= 0 or cols <= 0:
        return len(boxes), len(boxes)
    rs = sorted({0, rows} | {min(max(v, 0), rows) for b in boxes for v in b[:2]})
    cs = sorted({0, cols} | {min(max(v, 0), cols) for b in boxes for v in b[2:]})
    ri, ci = {v: i for i, v in enumerate(rs)}, {v: i for i, v in enumerate(cs)}
    count = [[0] * (len(cs) - 1) for _ in range(len(rs) - 1)]
    for r0, r1, c0, c1 in boxes:
        a, b = ri[min(max(r0, 0), rows)], ri[min(max(r1, 0), rows)]
        c, d = ci[min(max(c0, 0), cols)], ci[min(max(c1, 0), cols)]
        for i in range(a, b):
            line = count[i]
            for j in range(c, d):
                line[j] += 1
    cells = [v for line in count for v in line]
    return min(cells), max(cells)


def coverage(
    names: Sequence[str],
    per_rank: Sequence[Mapping[str, Window]],
    tensor_views: Mapping[str, list[int]],
    skipped: Sequence[str],
    deferred: Sequence[str],
) -> JsonObject:
    """For every tensor of the checkpoint: served (its view and how many ranks serve each byte,
    fewest and most), skipped or deferred. A tensor no rank reads has no view: its replicas are
    [0, 0]."""
    boxes: dict[str, list[Window]] = {}
    for ws in per_rank:
        for n, w in ws.items():
            boxes.setdefault(n, []).append(w)
    aside = set(skipped) | set(deferred)
    served, memo = {}, {}
    for n in names:
        if n in aside:
            continue
        view = tensor_views.get(n)
        key = (tuple(view or ()), tuple(sorted(map(tuple, boxes.get(n, [])))))
        if key not in memo:
            memo[key] = list(replicas(view, boxes.get(n, []))) if view else [0, 0]
        served[n] = {"view": view, "replicas": memo[key]}
    return {"served": served, "skipped": sorted(skipped), "deferred": sorted(deferred)}


def subject(
    catalogue: Catalogue,
    file_digests: Mapping[Path, str] | None,
    *,
    signature: tuple[str, str] | None = None,
) -> list[JsonObject]:
    """The checkpoint's identity: the signature bundle's sha256 when a model.sig vouched for the
    load (it names every file's digest, and a signer), its manifest's sha256, or each file's
    whole-file sha256 when the folder is vouched for file by file (hub blob names, local-dir
    etags). ``signature``: the bundle's name and the sha256 of the bytes that were verified
    (signing.SignedModel: the bundle is read once)."""
    out = []
    if signature is not None:
        out.append({"name": signature[0], "digest": {"sha256": signature[1]}})
    if catalogue.manifest_sha256:
        return out + [
            {
                "name": Path(catalogue.manifest_path).name,
                "digest": {"sha256": catalogue.manifest_sha256},
            }
        ]
    if signature is not None:
        return out  # the bundle signs each file's digest: it is the identity
    root = Path(catalogue.root)
    return [
        {"name": os.path.relpath(p, root), "digest": {"sha256": d}}
        for p, d in sorted((file_digests or {}).items())
    ]


def statement(
    planner: Planner,
    layout: Layout,
    *,
    kind: str,
    verify: str,
    config_spec: str,
    skip: Sequence[str] = (),
    defer: Sequence[str] = (),
    ranks: Sequence[Mapping[str, object]],
    file_digests: Mapping[Path, str] | None,
    vouched_by: str,
    signature: tuple[str, str] | None = None,
    trust: TrustSource | None = None,
    at: Placement | None = None,
) -> JsonObject:
    """The in-toto statement of a passed load. ``ranks``: each rank's ``node``, ``device`` and
    ``digest`` (from the exchanged table); ``trust``: the verdict's trust source
    (model/trust.py); ``at``: where the ranks stood, with replicas (each rank's plan is its
    position's); everything else is derived here from ``planner`` (the load's)."""
    # the load's catalogue is a storage's (planning sees it as a view of the table)
    catalogue, config = cast(Catalogue, planner.catalogue), planner.config
    plans = [planner.plan(layout, kind, position(at, r)) for r in range(layout.world)]
    per_rank = [windows(p) for p in plans]
    rank_docs = [
        {
            "rank": r,
            "node": ranks[r]["node"],
            "device": ranks[r]["device"],
            "digest": ranks[r]["digest"],
            "windows": per_rank[r],
            "deferred": list(plans[r].deferred),
        }
        for r in range(layout.world)
    ]
    options = {
        "tp": layout.tp,
        "ep": layout.ep,
        "kind": kind,
        "verify": verify,
        "skip": list(skip),
        "defer": list(defer),
        "config": config_spec,
        "config_name": config.name,
        "config_id": config.id(),
        # the config without the load's skip, defer and activation-scale rules: `attest verify`
        # tells a changed config from changed globs by it
        "config_base_id": base_config(config).id(),
    }
    if any(
        r.origin == "skip_activation_scales" for r in config.rules
    ):  # the switch's rule is in config_id
        options["skip_activation_scales"] = True
    cover = coverage(
        catalogue.names(),
        per_rank,
        views(plans),
        plans[0].skipped if plans else (),
        sorted({n for p in plans for n in p.deferred}),
    )
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject(catalogue, file_digests, signature=signature),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "tpload": {"version": __version__},
            "checkpoint": {
                "path": str(catalogue.root),
                "vouched_by": vouched_by,
                "trust": trust.to_dict() if trust is not None else None,
            },
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "options": options,
            "ranks": rank_docs,
            "coverage": cover,
        },
    }


def dumps(doc: Mapping[str, Any]) -> str:
    """The statement as JSON, indented, with each window and each coverage entry on one line of its
    own (a 64-rank DeepSeek-V3 statement holds 800,000 windows: one line each stays readable and
    diffable). The big maps are rendered apart and put in where a placeholder string stands (a token
    that does not occur in the rest of the text, so no tensor name can be mistaken for one)."""
    token = uuid.uuid4().hex
    pred = doc.get("predicate", {})
    big: dict[str, Mapping[str, Any]] = {}
    shell = dict(doc)
    if isinstance(pred, dict):
        shell["predicate"] = pred = dict(pred)
        if isinstance(pred.get("ranks"), list):
            pred["ranks"] = [dict(r) for r in pred["ranks"]]
            for k, r in enumerate(pred["ranks"]):
                if isinstance(r.get("windows"), dict):
                    big[f"{token}-w{k}"], r["windows"] = r["windows"], f"{token}-w{k}"
        if isinstance(pred.get("coverage"), dict) and isinstance(
            pred["coverage"].get("served"), dict
        ):
            pred["coverage"] = dict(pred["coverage"])
            big[f"{token}-c"], pred["coverage"]["served"] = pred["coverage"]["served"], f"{token}-c"
    parts = [json.dumps(shell, indent=1)]
    for key, table in big.items():  # each placeholder once, in the order the shell holds them
        head, _, tail = parts.pop().partition(json.dumps(key))
        lines = ",\n".join(
            f"{json.dumps(n)}: {json.dumps(v, separators=(',', ':'))}" for n, v in table.items()
        )
        parts += [head, "{\n" + lines + "\n}" if lines else "{}", tail]
    return "".join(parts) + "\n"


def write(
    path: str | os.PathLike[str], doc: Mapping[str, Any], key: str | os.PathLike[str] | None = None
) -> Path:
    """Write the statement (renamed into place: a reader never sees half of one) and, with ``key``,
    its signature beside it. A stale signature of an earlier statement is removed first."""
    out = Path(path).absolute()
    sig = signature_path(out)
    for target in (out, sig):  # nothing removed nor written when either is not a regular file
        if why := target_problem(target):
            raise NotRegularTarget(errno.EEXIST, why, str(target))
    if os.path.lexists(sig):
        os.unlink(sig)
    atomic_write(out, dumps(doc))
    if key is not None:
        sign(out, key)
    return out


def base_config(config: Config) -> Config:
    """``config`` without the rules a load adds from its options (config.with_rules: ``--skip``,
    ``--defer``, ``--skip-activation-scales``)."""
    added = ("skip", "defer", ACTIVATION_ORIGIN)
    return replace(config, rules=tuple(r for r in config.rules if r.origin not in added))


def after_load(
    opts: LoadOptions,
    rank_figures: Sequence[RankFigures],
    planner: Planner,
    layout: Layout,
    chosen: Strategy,
    verdict: Verdict,
    at: Placement | None = None,
) -> Path:
    """Rank 0, after a passed verdict: the statement of this load, written (and signed) where
    asked; ``at``: where the ranks stood, with replicas."""
    checkpoint = chosen.job.checkpoint
    signed = chosen.signed  # a model.sig vouched for the load: its bundle is the identity
    signature = (signed.bundle.name, signed.bundle_sha256) if signed is not None else None
    files = None if signed is not None else checkpoint.file_digests
    ranks = [{"node": f.node, "device": f.device, "digest": f.digest} for f in rank_figures]
    spec = (
        opts.config
    )  # a TOML path as an absolute one: `attest verify` may run from another folder
    spec = str(Path(spec).absolute()) if spec.endswith(".toml") and Path(spec).is_file() else spec
    doc = statement(
        planner,
        layout,
        kind=opts.kind,
        verify=opts.verify,
        config_spec=spec,
        skip=opts.skip,
        defer=opts.defer,
        ranks=ranks,
        file_digests=files,
        vouched_by=verdict.vouched_by,
        signature=signature,
        trust=verdict.trust,
        at=at,
    )
    if opts.attest is None:  # (rank 0 attests only when asked: _attest)
        raise LoadError("no attestation was asked for (a bug in tpload)")
    return write(opts.attest, doc, opts.attest_key)


def after_verdict(loaded: Loaded) -> None:
    """After a passed verdict, when the load was asked to attest (rank 0's row says so): rank 0
    writes the statement, and every rank learns whether it could (one small collective), or fails
    with it: no rank returns weights of a load whose attestation a controller waits for in vain."""
    ranks, ctx, opts = loaded.ranks, loaded.ctx, loaded.opts
    if not ranks[0].attest:
        return
    why = _attest(loaded) if ctx.rank == 0 else ""
    why = agree(why, ctx, seq=ranks[ctx.rank].seq, timeout_s=opts.timeout_s, step="the attestation")
    if why:
        loaded.result.drop()  # nothing of a load that fails survives it
        loaded.shards.release()
        raise LoadError(why, reporter=0)


def _attest(loaded: Loaded) -> str:
    """Rank 0 writes the attestation of a passed load; "" when it did, else why not (every rank then
    fails with it: :func:`after_verdict`). Its options were checked before loading (the key, the
    folder, not a folder itself), so only the write can fail here (a full disk, a folder gone): no
    statement is left at the path to be mistaken for this load's."""
    opts, verdict = loaded.opts, loaded.verdict
    verdict.require()  # an exit path of the gate: only a passed verdict is attested
    attest = opts.attest
    if attest is None:  # (rank 0's row said it attests only when asked)
        return ""
    try:
        path = after_load(
            opts, loaded.ranks, loaded.planner, loaded.layout, loaded.chosen, verdict, loaded.at
        )
    except Exception as e:  # noqa: BLE001 - whatever stops it, the peers wait for the word
        for stale in (attest, signature_path(attest)):
            with contextlib.suppress(OSError):
                if not os.path.isdir(stale):
                    os.unlink(stale)
        why = (
            (e.strerror if isinstance(e, OSError) else None) or (str(e).splitlines() or [""])[0]
            if isinstance(e, OSError | LoadError)
            else f"unexpected {type(e).__name__}: {e} (a bug in tpload)"
        )
        return (
            f"the load passed, but rank 0 could not write the load attestation "
            f"{escape_name(attest)} ({escape_name(why)}); no rank returned weights (a load "
            "asked to attest fails without its statement): free the space or fix the folder and "
            "load again"
        )
    rank_log(0).info(
        "wrote the load attestation %s%s",
        escape_name(path),
        f" (signed: {escape_name(signature_path(path))})" if opts.attest_key else "",
    )
    return ""

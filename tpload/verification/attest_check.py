"""Checking a load attestation: ``tpload attest verify FILE --checkpoint DIR``.

The plan is derived again from DIR's headers and the attested options, every rank's digest is
recomputed from DIR's bytes with the load's own code (:func:`tpload.verification.predict.predict`),
and every difference is listed: the subject, each rank's windows and deferred tensors, the
coverage, the digests and, with a key, the signature."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import LoadError
from ..report.progress import Meter
from ..text import escape_name
from .attest import PREDICATE_TYPE, STATEMENT_TYPE, Window, coverage, subject, views, windows
from .attest_signing import signature_path, signature_problems


def _fmt(w: Sequence[int]) -> str:
    return f"rows {w[0]}-{w[1]}, bytes {w[2]}-{w[3]}"


def _shape_problems(doc: object) -> list[str]:
    """What makes ``doc`` not a tpload load attestation at all (then nothing else is compared)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    if doc.get("_type") != STATEMENT_TYPE:
        problems.append(f"_type is {doc.get('_type')!r}, not {STATEMENT_TYPE}")
    if doc.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE}")
    subj = doc.get("subject")
    if not (
        isinstance(subj, list)
        and subj
        and all(
            isinstance(s, dict)
            and isinstance(s.get("name"), str)
            and isinstance(s.get("digest"), dict)
            for s in subj
        )
    ):
        problems.append("subject is not a list of {name, digest}")
    pred = doc.get("predicate")
    if not isinstance(pred, dict):
        return problems + ["predicate is not an object"]
    opts = pred.get("options")
    ints = isinstance(opts, dict) and all(
        type(opts.get(k)) is int and opts[k] >= 1 for k in ("tp", "ep")
    )
    texts = isinstance(opts, dict) and all(
        isinstance(opts.get(k), str) for k in ("kind", "verify", "config", "config_id")
    )
    globs = isinstance(opts, dict) and all(
        isinstance(opts.get(k), list) and all(isinstance(g, str) for g in opts[k])
        for k in ("skip", "defer")
    )
    if not (ints and texts and globs):
        problems.append(
            "predicate.options lacks tp, ep (integers >= 1), kind, verify, config, config_id or "
            "skip, defer (lists of globs)"
        )
    ranks = pred.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
        problems.append("predicate.ranks is not a list of objects")
    else:
        for k, r in enumerate(ranks):
            ws = r.get("windows")
            good = isinstance(ws, dict) and all(
                isinstance(w, list) and len(w) == 4 and all(type(v) is int for v in w)
                for w in ws.values()
            )
            deferred = r.get("deferred", [])
            names = isinstance(deferred, list) and all(isinstance(n, str) for n in deferred)
            if not (good and isinstance(r.get("digest"), str) and names):
                problems.append(
                    f"predicate.ranks[{k}]: needs windows "
                    f"({{tensor: [row0, row1, byte0, byte1]}}), "
                    "a digest and a deferred list"
                )
    cover = pred.get("coverage")
    if not (
        isinstance(cover, dict)
        and isinstance(cover.get("served"), dict)
        and all(
            isinstance(cover.get(k), list) and all(isinstance(n, str) for n in cover[k])
            for k in ("skipped", "deferred")
        )
    ):
        problems.append("predicate.coverage lacks served, skipped and deferred")
    return problems


def _subject_problems(attested: list[dict], now: list[dict], root: str) -> list[str]:
    got = {s["name"]: s["digest"].get("sha256") for s in attested}
    want = {s["name"]: s["digest"]["sha256"] for s in now}
    out = []
    for name in sorted(set(got) | set(want)):
        if name not in want:
            out.append(
                f"subject {escape_name(name)}: attested, but {root} has no such digest (its "
                f"identity is {', '.join(map(escape_name, sorted(want))) or 'nothing'})"
            )
        elif name not in got:
            out.append(
                f"subject {escape_name(name)}: {root}'s sha256 {want[name][:16]}... is not attested"
            )
        elif got[name] != want[name]:
            out.append(
                f"subject {escape_name(name)}: attested sha256 {str(got[name])[:16]}..., {root}'s "
                f"is {want[name][:16]}... (another checkpoint)"
            )
    return out


def _window_problems(
    rank: int, attested: Mapping[str, Window], planned: Mapping[str, Window]
) -> list[str]:
    out = []
    for n in sorted(set(attested) | set(planned)):
        a, p = attested.get(n), planned.get(n)
        if a == p:
            continue
        if a is None:
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: not attested; the plan serves {_fmt(p)}"
            )
        elif p is None:
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: attested {_fmt(a)}; the plan serves no "
                "window of it"
            )
        else:
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: attested {_fmt(a)}; the plan's window is "
                f"{_fmt(p)}"
            )
    return out


def _coverage_problems(attested: Mapping, planned: Mapping) -> list[str]:
    out = []
    for what, verb in (("skipped", "skip"), ("deferred", "defer")):
        a, p = set(attested[what]), set(planned[what])
        out += [
            f"tensor {escape_name(n)}: attested {what}; the plan does not {verb} it"
            for n in sorted(a - p)
        ]
        out += [
            f"tensor {escape_name(n)}: the plan {verb}s it; not attested {what}"
            for n in sorted(p - a)
        ]
    got, want = attested["served"], planned["served"]
    for n in sorted(set(got) | set(want)):
        a, p = got.get(n), want.get(n)
        if (
            p is not None and p["replicas"][0] < 1
        ):  # a gap in the plan itself, whatever was attested
            out.append(f"tensor {escape_name(n)}: some of its bytes are served by no rank")
        if a == p:
            continue
        if p is None:
            out.append(
                f"tensor {escape_name(n)}: attested served; the checkpoint has no such tensor to "
                "serve"
            )
        elif a is None:
            out.append(
                f"tensor {escape_name(n)}: not in the attested coverage; the plan serves each byte "
                f"{_times(p['replicas'])}"
            )
        else:
            out.append(
                f"tensor {escape_name(n)}: attested coverage {_cover(a)}; the plan's is {_cover(p)}"
            )
    return out


def _times(replicas: Sequence[int]) -> str:
    lo, hi = replicas
    return f"{lo} time(s)" if lo == hi else f"{lo} to {hi} times"


def _cover(c: object) -> str:
    if (
        not isinstance(c, dict)
        or not isinstance(c.get("replicas"), list)
        or len(c["replicas"]) != 2
    ):
        return repr(c)[:80]
    return f"view {c.get('view')}, each byte {_times(c['replicas'])}"


def check(
    path: str | os.PathLike,
    checkpoint: str | os.PathLike,
    *,
    key: str | os.PathLike | None = None,
    config: str | None = None,
    progress: Meter | None = None,
) -> tuple[list[str], list[str]]:
    """Every difference between the attestation at ``path`` and what ``checkpoint`` gives now, and
    notes (what was not checked). Raises LoadError when the file cannot be read at all.
    ``progress``: the command's meter, for recomputing the digests."""
    from .. import __version__
    from ..config import with_rules
    from ..pick import choose, planner_of
    from ..plan import Layout
    from ..storage import open_storage
    from .predict import predict

    path = Path(path)
    problems, notes = [], []
    if key is not None:
        problems += signature_problems(path, key)
    elif signature_path(path).is_file():
        notes.append(
            f"{escape_name(signature_path(path))} not checked (give --key PEM to check the "
            "signature)"
        )
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise LoadError(
            f"{escape_name(path)}: not a readable attestation ({escape_name(e)})"
        ) from None
    shape = _shape_problems(doc)
    if shape:
        return problems + [
            f"{escape_name(path)}: not a tpload load attestation: {p}" for p in shape
        ], notes
    pred = doc["predicate"]
    opts, ranks = pred["options"], pred["ranks"]
    version = (
        pred.get("tpload", {}).get("version") if isinstance(pred.get("tpload"), dict) else None
    )
    if version != __version__:
        notes.append(
            f"written by tpload {version}, checked by {__version__}: digests are recomputed by "
            "this version"
        )
    if opts["verify"] == "off":
        problems.append("options.verify is off: tpload attests only verified loads")
    layout = Layout(opts["tp"], opts["ep"])
    root = escape_name(Path(checkpoint))
    storage = open_storage(checkpoint, tp=layout.tp, ep=layout.ep, rank=0, world=layout.world)
    try:
        cat = storage.catalogue
        cat.refuse_headers_only("checking an attestation against it")
        bundle = next(
            (
                storage.root / e["name"]
                for e in doc["subject"]
                if isinstance(e, dict)
                and str(e.get("name", "")).endswith(".sig")
                and "/" not in str(e["name"])
            ),
            None,
        )
        problems += _subject_problems(
            doc["subject"],
            subject(cat, getattr(storage, "file_digests", None), signature=bundle),
            root,
        )
        chosen, _ = choose(config or opts["config"], storage.root, pins=cat.pins, header=cat.gguf)
        cfg = with_rules(
            chosen,
            skip=tuple(opts["skip"]),
            defer=tuple(opts["defer"]),
            skip_activation_scales=opts.get("skip_activation_scales") is True,
        )
        if cfg.id() != opts["config_id"]:
            differs = (
                f"config: attested {escape_name(opts.get('config_name', opts['config']))} (id "
                f"{escape_name(opts['config_id'])}); {escape_name(config or opts['config'])} gives "
                f"{escape_name(cfg.name)} (id {cfg.id()}) for {root} (pass --config)"
            )
            return [*problems, differs], notes
        planner = planner_of(cat, cfg)
        planner.check_layout(layout, layout.world)
        plans = [planner.plan(layout, opts["kind"], r) for r in range(layout.world)]
        if len(ranks) != layout.world:
            problems.append(
                f"{len(ranks)} rank(s) attested; tp {layout.tp} x ep {layout.ep} has {layout.world}"
            )
        for r, plan in enumerate(plans[: len(ranks)]):
            problems += _window_problems(r, ranks[r]["windows"], windows(plan))
            a, p = set(ranks[r].get("deferred", [])), set(plan.deferred)
            problems += [
                f"rank {r}: tensor {escape_name(n)}: attested deferred; the plan does not defer "
                "it here"
                for n in sorted(a - p)
            ]
            problems += [
                f"rank {r}: tensor {escape_name(n)}: deferred by the plan; not attested"
                for n in sorted(p - a)
            ]
        planned = coverage(
            cat.names(),
            [windows(p) for p in plans],
            views(plans),
            plans[0].skipped,
            sorted({n for p in plans for n in p.deferred}),
        )
        problems += _coverage_problems(pred["coverage"], planned)
        digests = predict(
            checkpoint,
            cfg,
            layout,
            opts["kind"],
            storage=None if storage.per_rank else storage,
            progress=progress,
        )
    finally:
        storage.close()
    for r, d in enumerate(digests[: len(ranks)]):
        if ranks[r]["digest"] != d:
            problems.append(
                f"rank {r}: digest attested {escape_name(ranks[r]['digest'][:16])}..., {root}'s "
                "bytes "
                f"give {d[:16]}... for its windows"
            )
    return problems, notes

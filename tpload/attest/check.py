"""Checking a load attestation: ``tpload attest verify FILE --checkpoint DIR``.

The attestation is read once, by the bounded reader (bad JSON, or JSON nested too deeply, is named
as bad input); a signed folder's model.sig is checked as the load checks it, with the same signer
options (or refused without them); the plan is derived again from DIR's headers and the attested
options, every rank's digest is recomputed from DIR's bytes with the load's own code
(:func:`tpload.attest.predict.predict`), and every difference is listed: the subject, each
rank's entry (its ``rank`` field, windows and deferred tensors), the coverage, the digests and,
with a key, the attestation's own signature. What the load left out (skipped or deferred tensors)
is said with its globs, and fails with ``--require-whole``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any  # an attestation's JSON values

from .. import __version__
from ..loading.pick import choose
from ..loading.planner import planner_of
from ..model.modes import Kind, Verify
from ..model.progress import Meter
from ..model.text import escape_name
from ..model.values import Json, JsonObject, Layout
from ..selection.config import Config, with_rules
from ..storage.files import parse_json, read_small
from ..storage.open import open_storage
from ..verification import signing
from .build import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Window,
    base_config,
    coverage,
    subject,
    views,
    windows,
)
from .predict import predict
from .signing import signature_path, signature_problems

ATTESTED_MODES = (Verify.NODE, Verify.RANK, Verify.DIGEST)
"""The verify modes a load attests (``--verify off`` is refused before loading)."""


@dataclass
class Checked:
    """What ``attest verify`` found: every difference, notes on what was not checked, and what the
    attested load left out (empty when it served every tensor)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    partial: str = ""
    """``96 of 190 tensors skipped (--skip 'model.visual.*')...``: the OK line says it."""


def _fmt(w: Sequence[int]) -> str:
    return f"rows {w[0]}-{w[1]}, bytes {w[2]}-{w[3]}"


def _shape_problems(doc: Json) -> list[str]:
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
    if not (ints and texts and globs) or not isinstance(opts, dict):
        problems.append(
            "predicate.options lacks tp, ep (integers >= 1), kind, verify, config, config_id or "
            "skip, defer (lists of globs)"
        )
    else:
        if opts["verify"] not in ATTESTED_MODES:
            problems.append(
                f"predicate.options.verify is {escape_name(opts['verify'])!r}, not a mode tpload "
                f"attests ({', '.join(ATTESTED_MODES)})"
            )
        if opts["kind"] not in tuple(Kind):
            problems.append(
                f"predicate.options.kind is {escape_name(opts['kind'])!r}, not one of "
                f"{', '.join(Kind)}"
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
            if type(r.get("rank")) is not int:
                problems.append(f"predicate.ranks[{k}]: needs its rank (an integer)")
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


def _subject_problems(attested: list[JsonObject], now: list[JsonObject], root: str) -> list[str]:
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
        if a is None and p is not None:
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: not attested; the plan serves {_fmt(p)}"
            )
        elif p is None and a is not None:
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: attested {_fmt(a)}; the plan serves no "
                "window of it"
            )
        elif a is not None and p is not None:  # (they differ)
            out.append(
                f"rank {rank}: tensor {escape_name(n)}: attested {_fmt(a)}; the plan's window is "
                f"{_fmt(p)}"
            )
    return out


def _coverage_problems(attested: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
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


def _cover(c: Json) -> str:
    if (
        not isinstance(c, dict)
        or not isinstance(c.get("replicas"), list)
        or len(c["replicas"]) != 2
    ):
        return repr(c)[:80]
    return f"view {c.get('view')}, each byte {_times(c['replicas'])}"


def _rank_problems(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Entry k is rank k's: each entry's ``rank`` field must be its place (two entries saying rank
    0, or two ranks swapped, would otherwise pass as the plan's ranks in list order)."""
    return [
        f"predicate.ranks[{k}] says rank {r['rank']}: entries are each rank's once, in rank "
        f"order (entry {k} must be rank {k}'s)"
        for k, r in enumerate(ranks)
        if r["rank"] != k
    ]


def _globs(flag: str, globs: Sequence[str]) -> str:
    return " ".join(f"{flag} {escape_name(g)!r}" for g in globs)


def _partial(opts: Mapping[str, Any], planned: Mapping[str, Any], total: int) -> str:
    """What the attested load left out, with the options that did it ("" when it served every
    tensor)."""
    parts = []
    skipped, deferred = len(planned["skipped"]), len(planned["deferred"])
    if skipped:
        why = [_globs("--skip", opts["skip"])] if opts["skip"] else []
        why += ["--skip-activation-scales"] if opts.get("skip_activation_scales") is True else []
        why += [] if why else ["the config's skip rules"]
        parts.append(f"{skipped} of {total} tensors skipped ({'; '.join(why)})")
    if deferred:
        left = _globs("--defer", opts["defer"]) if opts["defer"] else "the config's defer rules"
        parts.append(f"{deferred} of {total} deferred ({left}: located, not served)")
    return ", ".join(parts)


def _config_problem(
    opts: Mapping[str, Any], chosen: Config, cfg: Config, given: str | None, root: str
) -> str:
    """Why the config resolved now does not give the attested id, worded by which part differs: the
    config itself (``--config`` picks another), or the skip/defer globs (the config is the one the
    load used; the attested globs are not the ones that made the attested id)."""
    spec = escape_name(given or opts["config"])
    base = opts.get("config_base_id")
    if isinstance(base, str) and base == base_config(chosen).id():
        globs = [
            g
            for g in (
                _globs("--skip", opts["skip"]),
                _globs("--defer", opts["defer"]),
                "--skip-activation-scales" if opts.get("skip_activation_scales") is True else "",
            )
            if g
        ]
        return (
            f"config id: attested {escape_name(opts['config_id'])}; the attested skip and defer "
            f"globs ({', '.join(globs) or 'none'}) with config {escape_name(cfg.name)} (the one "
            f"the load used: id {base} without them) give {cfg.id()}: the skip or defer globs "
            "differ from the ones the load used (the attestation was edited)"
        )
    return (
        f"config: attested {escape_name(opts.get('config_name', opts['config']))} (id "
        f"{escape_name(opts['config_id'])}); {spec} gives {escape_name(cfg.name)} (id "
        f"{cfg.id()}) for {root}: another config than the load's (pass the load's with --config)"
    )


def _signed(
    doc: Mapping[str, Any], checkpoint: str | os.PathLike[str], signer: signing.SignerOptions | None
) -> tuple[signing.SignedModel | None, list[str]]:
    """The folder's model.sig checked as the load checks it (raises LoadError: a signed folder
    without a signer is refused, a bad signature named), and what differs from the attested
    signature."""
    opts = signer or signing.SignerOptions(str(checkpoint))
    signed = signing.precheck(opts)
    attested = [e["name"] for e in doc["subject"] if str(e["name"]).endswith(".sig")]
    problems = []
    if signed is None and attested:
        why = "--signature none" if opts.signature == signing.NONE else "the folder has none"
        problems.append(
            f"subject {escape_name(attested[0])}: the load was signed, but no signature was "
            f"checked here ({why}): give the bundle and signer the load used "
            f"({signing.SIGNER_FLAGS})"
        )
    trust = doc["predicate"].get("checkpoint", {})
    trust = trust.get("trust") if isinstance(trust, dict) else None
    said = trust.get("signer") if isinstance(trust, dict) else None
    if signed is not None and isinstance(said, str) and said != signed.signer_id:
        problems.append(
            f"signer: attested {escape_name(said)}; {escape_name(signed.bundle)} verifies with "
            f"{signed.signer_id}"
        )
    return signed, problems


def check(
    path: str | os.PathLike[str],
    checkpoint: str | os.PathLike[str],
    *,
    key: str | os.PathLike[str] | None = None,
    config: str | None = None,
    require_whole: bool = False,
    signer: signing.SignerOptions | None = None,
    progress: Meter | None = None,
) -> Checked:
    """Every difference between the attestation at ``path`` and what ``checkpoint`` gives now, notes
    (what was not checked) and what the load left out. ``signer``: the bundle and signer options
    for a signed folder (the load's). Raises LoadError when the file cannot be read at all, or
    the folder is signed and cannot be checked. ``progress``: the command's meter, for recomputing
    the digests."""
    path = Path(path)
    out = Checked()
    problems, notes = out.problems, out.notes
    data = read_small(path, "attestation")  # read once: the signature is checked on these bytes
    doc = parse_json(data, path, "attestation")
    if key is not None:
        problems += signature_problems(path, data, key)
    elif os.path.lexists(signature_path(path)):
        notes.append(
            f"{escape_name(signature_path(path))} not checked (give --key PEM to check the "
            "signature)"
        )
    shape = _shape_problems(doc)
    if shape or not isinstance(doc, dict):  # (not a dict: a shape problem)
        problems += [f"{escape_name(path)}: not a tpload load attestation: {p}" for p in shape]
        return out
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
    problems += _rank_problems(ranks)
    signed, differs = _signed(doc, checkpoint, signer)
    problems += differs
    layout = Layout(opts["tp"], opts["ep"])
    root = escape_name(Path(checkpoint))
    storage = open_storage(checkpoint, tp=layout.tp, ep=layout.ep, rank=0, world=layout.world)
    try:
        cat = storage.catalogue
        cat.refuse_headers_only("checking an attestation against it")
        if signed is not None:
            signed.check_covered(storage.paths())  # as the load: every file it reads is signed
            if signed.manifest_sha256:
                signed.check_manifest(cat.manifest_sha256)
        claimed = [  # an unchecked bundle is said once, by _signed
            e for e in doc["subject"] if signed is not None or not str(e["name"]).endswith(".sig")
        ]
        problems += _subject_problems(
            claimed,
            subject(
                cat,
                storage.file_digests,
                signature=(signed.bundle.name, signed.bundle_sha256) if signed else None,
            ),
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
            problems.append(_config_problem(opts, chosen, cfg, config, root))
            return out
        base = opts.get("config_base_id")
        if base is not None and base != base_config(cfg).id():
            problems.append(
                f"config_base_id: attested {escape_name(str(base))}; config {escape_name(cfg.name)}"
                f" without the load's globs is {base_config(cfg).id()} (the attestation was "
                "edited)"
            )
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
        out.partial = _partial(opts, planned, len(cat.names()))
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
    if require_whole and out.partial:
        problems.append(f"not whole: {out.partial} (--require-whole refuses a partial load)")
    return out

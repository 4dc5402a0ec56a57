"""The load attestation: an exit path of the gate that carries no bytes, only what they were.

After a passed verdict, ``--attest FILE`` makes rank 0 write an in-toto statement
(docs/attestation.md): its subject is the checkpoint's identity (the manifest's sha256, or each
file's whole-file digest when the folder is vouched for file by file), and its predicate every
rank's node, device, digest and windows (boxes of the stored tensors' 2-D byte views, as the plan
cuts them), with the coverage that follows: for every tensor of the checkpoint, how many ranks serve
each of its bytes (at least one; skipped and deferred tensors listed as such). Rank 0 derives every
rank's plan from the catalogue the load planned with (the planner is deterministic), so no extra
collective is made.

``tpload attest verify FILE --checkpoint DIR`` re-derives the plan from DIR's headers and the
recorded options, recomputes every rank's digest from DIR's bytes with the load's own code
(:func:`tpload.verification.predict.predict`), and lists every difference. With ``--attest-key`` the
statement is signed as model-signing signs a model (the statement as a one-file model, ``FILE.sig``
beside it), so one verifier checks both a signed model and a signed attestation.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import LoadError
from ..storage.files import read_small
from ..text import escape_name

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tpload.dev/load-attestation/v1"
SIGNATURE_SUFFIX = ".sig"
SIGNING_INSTALL = "pip install -e '.[signing]' in tpload's clone (model-signing and pyopenssl)"

Window = list[int]
"""[first row, end row, first byte column, end byte column) of a stored tensor's 2-D byte view."""


# -- signing (model-signing, optional) -------------------------------------------------------------


def signing_missing() -> str | None:
    """Why attestations cannot be signed or their signatures checked here (None: they can)."""
    try:
        import model_signing  # noqa: F401  # only probing that the optional extra is installed
    except (
        ImportError
    ) as e:  # model-signing 1.1.1 also imports OpenSSL (pyopenssl) without declaring it
        return (
            f"signing needs model-signing, which is not importable ({e.name or e}); "
            f"{SIGNING_INSTALL}"
        )
    return None


def key_problem(key: str | os.PathLike) -> str | None:
    """Why ``key`` cannot sign an attestation (None: it is an unencrypted EC private key in PEM)."""
    why = signing_missing()
    if why:
        return why
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        loaded = load_pem_private_key(Path(key).read_bytes(), password=None)
    except OSError as e:
        return f"{escape_name(key)}: cannot read it ({e.strerror})"
    except (ValueError, TypeError) as e:  # not PEM, or encrypted
        return f"{escape_name(key)}: not an unencrypted private key in PEM ({_first_line(e)})"
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        return (
            f"{escape_name(key)}: a {type(loaded).__name__}, not an elliptic-curve private key "
            "(model-signing's key method)"
        )
    return None


def _model_signing() -> object:
    why = signing_missing()
    if why:
        raise LoadError(why)
    import model_signing

    return model_signing


def signature_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + SIGNATURE_SUFFIX)


def sign(path: Path, key: str | os.PathLike) -> Path:
    """Sign the attestation at ``path`` with an EC private key, the way model-signing signs a model
    (the file as a one-file model); the bundle is written beside it and renamed into place."""
    ms = _model_signing()
    out = signature_path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    try:
        ms.signing.Config().use_elliptic_key_signer(private_key=Path(key)).sign(path, tmp)
        os.replace(tmp, out)
    except Exception as e:  # noqa: BLE001 - model-signing raises ValueError, OSError, cryptography's types
        raise LoadError(
            f"could not sign {escape_name(path)} with {escape_name(key)}: "
            f"{type(e).__name__}: {_first_line(e)}"
        ) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return out


def signature_problems(path: Path, key: str | os.PathLike) -> list[str]:
    """The signature beside ``path`` checked with the public key ``key`` by model-signing (the
    bundle, the key and the attestation's own sha256): [] when it verifies, else one line saying
    why."""
    ms = _model_signing()
    sig = signature_path(path)
    if not sig.is_file():
        return [f"{escape_name(sig)}: no signature beside the attestation (--key was given)"]
    try:
        ms.verifying.Config().use_elliptic_key_verifier(public_key=Path(key)).verify(path, sig)
    except Exception as e:  # noqa: BLE001 - ValueError for a mismatch; cryptography's, protobuf's for a bad file
        text = _first_line(e)
        if text.startswith("Signature mismatch"):
            return [
                f"{escape_name(path)}: its bytes are not the ones {escape_name(sig)} signed "
                "(changed since)"
            ]
        return [f"{escape_name(sig)}: does not verify with the key {escape_name(key)}: {text}"]
    return []


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return escape_name(text[0][:300]) if text else type(e).__name__


# -- what a load serves -------------------------------------------------------------------------


def windows(plan: object) -> dict[str, Window]:
    """Every stored tensor this rank reads a window of, and the window (from ``RankPlan.reads``)."""
    return {
        n: [int(rows[0]), int(rows[1]), int(cols[0]), int(cols[1])]
        for n, (rows, cols) in plan.reads.items()
    }


def views(plans: Sequence[object]) -> dict[str, list[int]]:
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
                if cut is not None:
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
) -> dict:
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
    catalogue: object, file_digests: Mapping[Path, str] | None, *, signature: Path | None = None
) -> list[dict]:
    """The checkpoint's identity: the signature bundle's sha256 when a model.sig vouched for the
    load (it names every file's digest, and a signer), its manifest's sha256, or each file's
    whole-file sha256 when the folder is vouched for file by file (hub blob names, local-dir
    etags)."""
    out = []
    if signature is not None:
        out.append(
            {
                "name": signature.name,
                "digest": {
                    "sha256": hashlib.sha256(read_small(signature, "signature bundle")).hexdigest()
                },
            }
        )
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
    planner: object,
    layout: object,
    *,
    kind: str,
    verify: str,
    config_spec: str,
    skip: Sequence[str] = (),
    defer: Sequence[str] = (),
    ranks: Sequence[Mapping[str, object]],
    file_digests: Mapping[Path, str] | None,
    vouched_by: str,
    signature: Path | None = None,
) -> dict:
    """The in-toto statement of a passed load. ``ranks``: each rank's ``node``, ``device`` and
    ``digest`` (from the exchanged table); everything else is derived here from ``planner`` (the
    load's)."""
    from .. import __version__

    catalogue, config = planner.catalogue, planner.config
    plans = [planner.plan(layout, kind, r) for r in range(layout.world)]
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
            "checkpoint": {"path": str(catalogue.root), "vouched_by": vouched_by},
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "options": options,
            "ranks": rank_docs,
            "coverage": cover,
        },
    }


def dumps(doc: Mapping) -> str:
    """The statement as JSON, indented, with each window and each coverage entry on one line of its
    own (a 64-rank DeepSeek-V3 statement holds 800,000 windows: one line each stays readable and
    diffable). The big maps are rendered apart and put in where a placeholder string stands (a token
    that does not occur in the rest of the text, so no tensor name can be mistaken for one)."""
    token = uuid.uuid4().hex
    pred = doc.get("predicate", {})
    big: dict[str, Mapping] = {}
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


def write(path: str | os.PathLike, doc: Mapping, key: str | os.PathLike | None = None) -> Path:
    """Write the statement (renamed into place: a reader never sees half of one) and, with ``key``,
    its signature beside it. A stale signature of an earlier statement is removed first."""
    from ..storage.files import atomic_write

    out = Path(path).absolute()
    sig = signature_path(out)
    if os.path.lexists(sig):
        os.unlink(sig)
    atomic_write(out, dumps(doc))
    if key is not None:
        sign(out, key)
    return out


def after_load(
    opts: object,
    rank_figures: Sequence[object],
    planner: object,
    layout: object,
    chosen: object,
    vouched_by: str,
) -> Path:
    """Rank 0, after a passed verdict: the statement of this load, written (and signed) where
    asked."""
    storage = chosen.job.storage
    signed = getattr(
        chosen, "signed", None
    )  # a model.sig vouched for the load: its bundle is the identity
    signature = signed.bundle if signed is not None else None
    files = None if signed is not None else getattr(storage, "file_digests", None)
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
        vouched_by=vouched_by,
        signature=signature,
    )
    return write(opts.attest, doc, opts.attest_key)


# -- checking one ----------------------------------------------------------------------------------


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
) -> tuple[list[str], list[str]]:
    """Every difference between the attestation at ``path`` and what ``checkpoint`` gives now, and
    notes (what was not checked). Raises LoadError when the file cannot be read at all."""
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
                Path(checkpoint) / e["name"]
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
        chosen, _ = choose(config or opts["config"], storage.root, pins=cat.pins)
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
            checkpoint, cfg, layout, opts["kind"], storage=None if storage.per_rank else storage
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

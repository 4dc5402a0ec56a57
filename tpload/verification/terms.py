"""What every rank of a load must agree on (the terms: the trust anchor's identity, the config,
the sha256 of every file that shapes the plan, every option that shapes the served bytes), and the
verdict's check that the exchanged rows agree.

The handshake before the copy loop compares the terms first (distributed/agreement.py); the
exchange's row carries their hashes again (``RankFigures.agreed``), and the verdict refuses rows
that differ (:func:`disagreement`, from verification/gate.py's ``judge``): no load passes on a table
whose ranks disagree."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..model.text import rank_ranges
from ..model.values import AGREED_BYTES, Layout

if TYPE_CHECKING:  # the exchanged row, as the gate reads it
    from .strategy import RankRow, VerifyOptions

FIELDS = (
    ("verify", "the verify mode", "give every rank the same --verify"),
    ("kind", "the kind", "give every rank the same --kind"),
    ("tp", "tp", "give every rank the same --tp"),
    ("ep", "ep", "give every rank the same --ep"),
    ("replicas", "the replicas", "give every rank the same --replicas (or replica_group)"),
    ("skip", "the skip globs", "give every rank the same --skip globs"),
    ("defer", "the defer globs", "give every rank the same --defer globs"),
    (
        "skip_activation_scales",
        "skip_activation_scales",
        "give every rank the same --skip-activation-scales",
    ),
    *(
        (
            name,
            name,
            f"every node must hold the same {name}: compare the copies (sha256sum), and pin it "
            "with `python -m tpload manifest DIR --force` and --manifest-sha256 HEX on every rank",
        )
        for name in ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
    ),
    (
        "gguf_kv",
        "the GGUF key-values",
        "every node must hold the same GGUF header: compare the copies (sha256sum), and pin them "
        "with `python -m tpload manifest FILE --force` and --manifest-sha256 HEX on every rank",
    ),
    ("config", "the config", "give every rank the same --config (and the same config.json)"),
    (
        "signature",
        "the signature checked",
        "every rank must check the same signature (the same model.sig, by its bytes, and the "
        "same signer), or none: give every rank the same --signature and --signer-* options",
    ),
    (
        "anchor",
        "the trust anchor",
        "every node must hold the same checkpoint: check each copy with `python -m tpload verify "
        "DIR`, and pin it with --manifest-sha256 HEX on every rank",
    ),
)
"""(name, what a message calls it, the fix), in the order a difference is named: the options a
rank was given first, then what it found (the files that shape the plan, whether the manifest pins
them or not: a config.json with other head counts cuts every window another way under the same
config id; then the config, the anchor)."""

PLAN_FIELDS = ("config.json", "hf_quant_config.json", "model.safetensors.index.json", "gguf_kv")
"""The fields that are a file's sha256 (storage/pins.py's ``plan_file_digests`` keys them so)."""


SHOWN_BYTES = 64
"""Bytes of each value a row carries to name it (a multiple of 8: the row is int64 words)."""


def _hash(value: str) -> int:
    raw = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(raw[:8], "little", signed=True)


def shown_bytes(value: str) -> bytes:
    """The first :data:`SHOWN_BYTES` of a value (cut on a character boundary, ``...`` where cut)."""
    raw = value.encode("utf-8", "backslashreplace")
    if len(raw) > SHOWN_BYTES:
        raw = raw[: SHOWN_BYTES - 3].decode(errors="ignore").encode() + b"..."
    return raw.ljust(SHOWN_BYTES, b"\0")


def _short(sha: str) -> str:
    return f"sha256 {sha[:16]}" if sha else "absent"


def _globs(globs: Sequence[str]) -> str:
    return ", ".join(sorted(set(globs))) or "none"


class Rules(Protocol):
    """The config the load plans by (selection/config.py's Config satisfies it)."""

    @property
    def name(self) -> str: ...

    def id(self) -> str: ...


class Groups(Protocol):
    """Where the replicas stand (distributed/placement.py's Placement satisfies it)."""

    @property
    def groups(self) -> Sequence[Sequence[int]]: ...


@dataclass(frozen=True)
class Terms:
    """What this rank is about to load, one value per field of :data:`FIELDS`: ``values`` are
    hashed (and compared), ``shown`` name them in a message."""

    values: tuple[str, ...]
    shown: tuple[str, ...]

    @classmethod
    def of(
        cls,
        opts: VerifyOptions,
        layout: Layout,
        config: Rules,
        anchor: str,
        placement: Groups | None,
        plan_files: Mapping[str, str],
        signature: str = "none",
    ) -> Terms:
        """``anchor``: the gate's strategy's (Strategy.anchor); ``placement``: where the replicas
        stand (replicas.placement's, None without replicas); ``plan_files``: the sha256 (hex) of
        each of :data:`PLAN_FIELDS` as this rank holds it, "" where absent; ``signature``: the
        strategy's (Strategy.signature: the bundle's sha256 and signer, or "none")."""
        replicas, groups = "1", placement.groups if placement is not None else None
        if groups:
            n, size = len(groups[0]), len(groups)
            in_order = [[q * size + p for q in range(n)] for p in range(size)]
            placed = [list(g) for g in groups]
            replicas = str(n) if placed == in_order else f"{n}, placed {placed}"
        cid = config.id()
        values = {
            "verify": str(opts.verify),
            "kind": str(opts.kind),
            "tp": str(layout.tp),
            "ep": str(layout.ep),
            "replicas": replicas,
            "skip": _globs(opts.skip),
            "defer": _globs(opts.defer),
            "skip_activation_scales": "on" if opts.skip_activation_scales else "off",
            "config": cid,
            "signature": signature,
            "anchor": anchor,
            **{f: plan_files[f] or "absent" for f in PLAN_FIELDS},
        }
        shown = dict(values, config=f"{config.name} (id {cid})")
        shown.update({f: _short(plan_files[f]) for f in PLAN_FIELDS})
        return cls(tuple(values[f] for f, _, _ in FIELDS), tuple(shown[f] for f, _, _ in FIELDS))

    def hashes(self) -> list[int]:
        return [_hash(v) for v in self.values]

    def hex(self) -> str:
        """The hashes for the exchange's row (16 hex digits a field)."""
        return "".join((h & (2**64 - 1)).to_bytes(8, "big").hex() for h in self.hashes())


def disagreement(ranks: Sequence[RankRow]) -> list[str]:
    """From the exchanged rows (the verdict's second look): a passed rank whose row does not say
    what it loaded, or rows whose terms differ, naming the first field and the ranks by hash."""
    silent = [r.rank for r in ranks if len(r.agreed) != AGREED_BYTES]
    if silent:
        return [f"rank {rank_ranges(silent)}: its row does not say what it loaded (no handshake)"]
    for k, (_, what, fix) in enumerate(FIELDS):
        sides: dict[str, list[int]] = {}
        for r in ranks:
            sides.setdefault(r.agreed[16 * k : 16 * (k + 1)], []).append(r.rank)
        if len(sides) > 1:
            said = "; ".join(f"rank {rank_ranges(who)}: hash {h}" for h, who in sides.items())
            return [f"the ranks' rows differ in {what} ({said}); {fix}"]
    return []

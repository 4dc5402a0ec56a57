"""The KV-cache scale census: how a checkpoint spells each attention layer's FP8 k/v scales.

Checkpoints spell them many ways; vLLM remaps them (``maybe_remap_kv_scale_name``) and only warns
when one is not loaded, leaving the scale at a sentinel. The census finds every spelling per layer,
gives each layer's canonical name (vLLM's ``...self_attn.attn.k_scale``) beside the stored one, and
says what is wrong: a layer with k but no v, two spellings on one layer, scales on some attention
layers only (refused or reported, by the config's ``kv_scales``). The planner takes it of what a
load serves or defers (planning/classify.py): a layer a skip rule removes (a vision tower's
attention, an MTP layer) is not counted. ``state_dict()`` keeps the stored names; the vLLM hand-off
passes the scales under the canonical ones (:meth:`Census.engine_names`); their values are checked
as they are read (codecs/plain.py: finite and > 0).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..model.text import escape_name

BOTH = "kv"
SPELLINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # (spelling, pattern: group "stem" ends at the layer's "layers.N.", "layer" its number, "which"
    # k or v)
    (
        "self_attn.attn.{k,v}_scale",
        re.compile(
            r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.attn\.(?P<which>[kv])_scale$"
        ),
    ),
    (
        "self_attn.{k,v}_scale",
        re.compile(r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.(?P<which>[kv])_scale$"),
    ),
    (
        "self_attn.{k,v}_proj.output_scale (compressed-tensors, Quark)",
        re.compile(
            r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.(?P<which>[kv])_proj\.output_scale$"
        ),
    ),
    (
        "self_attn.{k,v}_proj.{k,v}_scale (ModelOpt)",
        re.compile(
            r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.(?P<which>[kv])_proj\.(?P=which)_scale$"
        ),
    ),
    (
        "self_attn.kv_scale (deprecated: one scale for k and v)",
        re.compile(r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.(?P<which>kv)_scale$"),
    ),
    (
        "self_attn.qkv_proj.{k,v}_scale",
        re.compile(
            r"(?P<stem>(?:.*\.)?layers\.(?P<layer>\d+)\.)self_attn\.qkv_proj\.(?P<which>[kv])_scale$"
        ),
    ),
    (
        "blk.N.attn_{k,v}_scale (GGUF)",
        re.compile(r"(?P<stem>blk\.(?P<layer>\d+)\.)attn_(?P<which>[kv])_scale(?:\.weight)?$"),
    ),
)
_ATTENTION = re.compile(r"((?:.*\.)?layers\.\d+\.)self_attn\.|(blk\.\d+\.)attn_")


@dataclass
class LayerScales:
    """One attention layer's scales as stored."""

    stem: str
    """The layer's stored prefix (``model.layers.3.``, ``blk.3.``)."""
    spellings: list[str] = field(default_factory=list)
    k: list[str] = field(default_factory=list)
    """Stored names giving k (a deprecated ``kv_scale`` gives both)."""
    v: list[str] = field(default_factory=list)

    def of(self, which: str) -> list[str]:
        """The stored names giving ``which`` ("k" or "v")."""
        return self.k if which == "k" else self.v

    def canonical(self, which: str) -> str:
        """vLLM's name of this layer's ``which`` scale (a GGUF layer as vLLM's GGUF loader names
        it)."""
        stem = re.sub(r"^blk\.(\d+)\.$", r"model.layers.\1.", self.stem)
        return f"{stem}self_attn.attn.{which}_scale"

    def to_dict(self) -> dict[str, object]:
        return {
            "layer": self.stem,
            "spellings": self.spellings,
            "k": self.k,
            "v": self.v,
            "vllm": {"k": self.canonical("k"), "v": self.canonical("v")},
        }


@dataclass
class Census:
    """Every attention layer's k/v scales, by stored spelling."""

    layers: dict[str, LayerScales]
    """Layers with any scale, in order of their numbers."""
    attention: list[str]
    """Every attention layer's stem (with scales or not)."""

    def __bool__(self) -> bool:
        return bool(self.layers)

    def problems(self) -> list[str]:
        """What a strict config refuses, one line each, naming the layers."""
        out = []
        half = [
            f"{s.stem} ({'k' if s.k else 'v'} only)"
            for s in self.layers.values()
            if bool(s.k) != bool(s.v)
        ]
        if half:
            out.append(f"kv-cache scales: {len(half)} layer(s) with one of k and v: {_names(half)}")
        doubled = [
            f"{s.stem} ({' and '.join(s.spellings)})"
            for s in self.layers.values()
            if len(s.spellings) > 1
        ]
        if doubled:
            out.append(
                f"kv-cache scales: {len(doubled)} layer(s) spelled two ways: {_names(doubled)}"
            )
        if self.layers:
            bare = [a for a in self.attention if a not in self.layers]
            if bare:
                out.append(
                    f"kv-cache scales on {len(self.layers)} of {len(self.attention)} attention "
                    f"layers; none on {_names(bare)}"
                )
        return out

    def describe(self) -> list[str]:
        """The census for ``plan`` and the report: the layers of each spelling, and what was
        found."""
        if not self.layers:
            return []
        by: dict[str, list[LayerScales]] = {}
        for s in self.layers.values():
            by.setdefault(" + ".join(s.spellings), []).append(s)
        parts = []
        for spelling, held in by.items():
            k, v = sum(bool(s.k) for s in held), sum(bool(s.v) for s in held)
            parts.append(f"{spelling} on {len(held)} layer(s) ({_span(held)}; k on {k}, v on {v})")
        first = next(iter(self.layers.values()))
        return [
            f"kv-cache scales: {len(self.layers)} of {len(self.attention)} attention layers: "
            + "; ".join(parts)
            + f"; served as stored, handed to vLLM as {first.canonical('k')}..."
        ]

    def engine_names(self) -> dict[str, tuple[str, ...]]:
        """{stored name: the names vLLM's attention layers expect it under}: a deprecated
        ``kv_scale`` under both k and v (vLLM itself maps it to k only, and leaves v at its
        sentinel)."""
        out: dict[str, tuple[str, ...]] = {}
        for s in self.layers.values():
            for which in "kv":
                for name in s.of(which):
                    out[name] = out.get(name, ()) + (s.canonical(which),)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "attention_layers": len(self.attention),
            "layers": [s.to_dict() for s in self.layers.values()],
        }


def census(names: Iterable[str]) -> Census:
    """The census of a checkpoint's tensor names (stored names; no bytes read)."""
    layers: dict[str, LayerScales] = {}
    attention: dict[str, None] = {}
    for n in names:
        a = _ATTENTION.match(n)
        if a is None:
            continue
        attention.setdefault(a.group(1) or a.group(2))
        for spelling, rx in SPELLINGS:
            m = rx.match(n)
            if m is None:
                continue
            s = layers.setdefault(m.group("stem"), LayerScales(m.group("stem")))
            if spelling not in s.spellings:
                s.spellings.append(spelling)
            for which in m.group("which"):
                s.of(which).append(n)
            break
    order = lambda stem: (re.sub(r"\d+\.$", "", stem), _layer(stem))  # noqa: E731
    return Census({k: layers[k] for k in sorted(layers, key=order)}, sorted(attention, key=order))


def _layer(stem: str) -> int:
    """The layer number a stem ends in (``model.layers.12.``: 12)."""
    m = re.search(r"(\d+)\.$", stem)
    if m is None:  # (the census's patterns take numbered layers only)
        raise ValueError(f"{stem!r} names no layer")
    return int(m.group(1))


def _span(held: list[LayerScales]) -> str:
    nums = [_layer(s.stem) for s in held]
    if len(nums) == 1:
        return f"layer {nums[0]}"
    run = nums == list(range(nums[0], nums[-1] + 1))
    return (
        f"layers {nums[0]}..{nums[-1]}"
        if run
        else "layers " + ", ".join(map(str, nums[:12])) + (" ..." if len(nums) > 12 else "")
    )


def _names(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(escape_name(i) for i in items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")

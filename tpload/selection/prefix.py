"""The prefix a checkpoint names its decoder layers under, found once from the catalogue.

Checkpoints name the same weights under different prefixes: ``model.layers.N...`` (most causal LMs),
``language_model.model.layers.N...`` (multimodal wrappers), ``model.language_model.layers.N...``
(newer transformers' multimodal classes) or none (``layers.N...``); MTP heads sit under ``mtp.`` or
as layers past ``num_hidden_layers``. A config's rules are written for one prefix (its
``weight_prefix``: said in its ``[layout]``, or read off its globs). :class:`Prefix` rewrites a
stored name into the config's prefix *for matching only*: what is served keeps the stored name, so
digests and stored predictions do not change with the prefix.

Two prefixes in one folder are refused when they hold the same weight: layers under both, or one
tensor outside the layers under both (``model.embed_tokens.weight`` beside
``language_model.model.embed_tokens.weight``: two models, or one weight stored twice). A tensor
outside the layers under another prefix with no twin loads, matched as stored, and the prefix line
says so: multimodal checkpoints keep a vision tower and a projector beside the language model
(``vision_tower.*``, ``model.visual.*`` beside ``model.language_model.*``); those sit under no
candidate or under the wrapper of the layers' own prefix, and are not noted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..model.errors import ConfigError
from ..model.table import Templates
from ..model.text import escape_name

CANDIDATES = ("language_model.model.", "model.language_model.", "model.", "")
"""The prefixes looked for, the longest first (a vision tower's ``...encoder.layers.N`` is none of
them)."""
OUTSIDE = ("mtp.", "lm_head.")
"""Top-level names that stay where they are when the body moves (no prefix -> ``model.``)."""
_LAYER = re.compile(r"(.*?)layers\.(\d+)\.")
_LAYER_LINES = re.compile(
    "^(" + "|".join(map(re.escape, CANDIDATES)) + r")layers\.(\d+)\.", re.MULTILINE
)
r"""Each line's layer under a candidate prefix: what ``^(.*?)layers\.(\d+)\.`` finds in a line
when its prefix is a candidate, and nothing otherwise (no candidate holds ``layers.``, so one that
matches is the shortest prefix that does), tried at a line's start only instead of at every byte
of it."""
_MARK = "\n"
"""A digit run in a template's text (the templates are read whole: no name holds it)."""
_LAYER_TEMPLATE = re.compile(r"(.*?)layers\.\n\.")


@dataclass(frozen=True)
class Prefix:
    """The prefix found in a catalogue, and how its names are rewritten for a config's rules."""

    found: str | None
    """The stored prefix of the layers (``""``: none); None when no name has layers."""
    wanted: str | None
    """The config's prefix (None: its rules are prefix-blind, nothing is rewritten)."""
    layers: int = 0
    """Layers found under ``found``."""
    mtp: str = ""
    """How the checkpoint holds MTP heads, in words ("" when it holds none)."""
    elsewhere: str = ""
    """Tensors outside the layers under another prefix (no twin under this one), in words."""

    @property
    def rewrites(self) -> bool:
        return self.found is not None and self.wanted is not None and self.found != self.wanted

    def rewrite(self, name: str) -> str:
        """``name`` as the config's rules spell it (the stored name itself when nothing moves)."""
        found, wanted = self.found, self.wanted
        if not self.rewrites or wanted is None or name.startswith(OUTSIDE):  # (rewrites: wanted)
            return name
        if found and name.startswith(found):
            return wanted + name[len(found) :]
        if not found:  # no prefix: the whole body moves under the config's
            return wanted + name
        wrapper = found[: -len(wanted)] if wanted and found.endswith(wanted) else ""
        if wrapper.endswith(".") and name.startswith(
            wrapper
        ):  # language_model.lm_head.weight -> lm_head.weight
            return name[len(wrapper) :]
        return name

    def describe(self) -> str:
        """One line for ``plan`` and the report."""
        if self.found is None:
            return "weight prefix: no decoder layers found (names matched as stored)"
        said = f"weight prefix {self.found!r} ({self.layers} layers"
        said += f"; {self.mtp})" if self.mtp else ")"
        if self.elsewhere:
            said += f"; {self.elsewhere}"
        if self.rewrites:
            said += (
                f"; the config's rules, written for {self.wanted!r}, match its names rewritten "
                "(served as stored)"
            )
        return said


def detect(
    names: Iterable[str],
    *,
    wanted: str | None,
    model: Mapping[str, object] | None = None,
    where: str | os.PathLike[str] = "the checkpoint",
    templates: Templates | None = None,
) -> Prefix:
    """The layers' prefix among :data:`CANDIDATES`; ConfigError naming both when two prefixes hold
    layers (one weight stored twice, or two models in one folder). ``model``: config.json, for MTP
    layers past ``num_hidden_layers``. ``templates``: those of ``names``, in their order (the
    table's): the layers are then read off the few templates, not the 92,000 names (where every
    name was read: no literal template)."""
    names = list(names)
    if templates is not None and templates.whole:
        return _by_templates(names, templates, wanted=wanted, model=model, where=where)
    text = "\n".join(names)
    if text.count("\n") == len(names) - 1:  # no name holds a newline: one C-level scan of them all
        layers_of: dict[str, set[str]] = {}
        for p, i in set(_LAYER_LINES.findall(text)):
            if p in CANDIDATES:
                layers_of.setdefault(p, set()).add(i)
        if len(layers_of) == 1:
            ((found, held_layers),) = layers_of.items()
            mtp = text.startswith("mtp.") or "\nmtp." in text
            elsewhere = _elsewhere(names, found, where)
            return _found(found, wanted, sorted(set(map(int, held_layers))), mtp, model, elsewhere)
        if not layers_of:
            mtp = text.startswith("mtp.") or "\nmtp." in text
            return Prefix(None, wanted, mtp="MTP under 'mtp.'" if mtp else "")
    held: dict[str, dict[str, str]] = {}  # prefix -> {the rest of the name: the stored name}
    indices: dict[str, set[int]] = {}
    mtp = False
    for n in names:
        if n.startswith("mtp."):
            mtp = True
            continue
        m = _LAYER.match(n)
        if m is None or m.group(1) not in CANDIDATES:
            continue
        p = m.group(1)
        held.setdefault(p, {})[n[len(p) :]] = n
        indices.setdefault(p, set()).add(int(m.group(2)))
    if len(held) > 1:
        (p1, a), (p2, b) = sorted(held.items(), key=lambda kv: -len(kv[1]))[:2]
        both = sorted(set(a) & set(b))
        example = (
            f"{escape_name(a[both[0]])} and {escape_name(b[both[0]])} are one weight"
            if both
            else f"e.g. {escape_name(next(iter(a.values())))} and "
            f"{escape_name(next(iter(b.values())))}"
        )
        raise ConfigError(
            f"{escape_name(where)}: ambiguous weight prefix: layers under both {p1!r} and {p2!r} "
            f"({example}{f', {len(both)} such weights' if len(both) > 1 else ''}); keep one model "
            "per folder"
        )
    if not held:
        return Prefix(None, wanted, mtp="MTP under 'mtp.'" if mtp else "")
    found = next(iter(held))
    elsewhere = _elsewhere(names, found, where)
    return _found(found, wanted, sorted(indices[found]), mtp, model, elsewhere)


def _by_templates(
    names: list[str],
    tpl: Templates,
    *,
    wanted: str | None,
    model: Mapping[str, object] | None,
    where: str | os.PathLike[str],
) -> Prefix:
    """:func:`detect` read off the names' templates: a name's first ``layers.N.`` is its
    template's first ``layers.#.`` (the text holds no digit, and a run is whole), the prefix before
    it the text before it (one holding a run is no candidate) and N that run's value. Two prefixes
    holding layers take the name-by-name walk, which words the refusal."""
    layered: dict[str, list[int]] = {}  # prefix -> the templates with layers under it
    for t, text in enumerate(tpl.texts):
        m = _LAYER_TEMPLATE.match(_MARK.join(text))
        if m is not None and m.group(1) in CANDIDATES:
            layered.setdefault(m.group(1), []).append(t)
    mtp = any(text[0].startswith("mtp.") for text in tpl.texts)
    if len(layered) > 1:
        return detect(names, wanted=wanted, model=model, where=where)
    if not layered:
        return Prefix(None, wanted, mtp="MTP under 'mtp.'" if mtp else "")
    ((found, layer_templates),) = layered.items()
    # a candidate holds no digit: the layer's index is its name's first run
    held = np.unique(tpl.values[np.isin(tpl.ids, layer_templates), 0]).tolist()
    # the names outside the layers: those of the templates without "layers." (it holds no digit)
    outside = np.flatnonzero([not any("layers." in part for part in text) for text in tpl.texts])
    rows = np.flatnonzero(np.isin(tpl.ids, outside)).tolist()
    elsewhere = _elsewhere([names[k] for k in rows], found, where)
    return _found(found, wanted, held, mtp, model, elsewhere)


def _elsewhere(names: list[str], found: str, where: str | os.PathLike[str]) -> str:
    """Tensors outside the layers under a candidate prefix other than the layers' ``found``:
    ConfigError naming both prefixes when one is a tensor ``found`` holds too (the same name after
    its prefix); the others under a prefix that is not ``found``'s wrapper, in words ("" none)."""
    # the layers' wrapper holds the body's head: language_model.lm_head.weight beside
    # language_model.model.*
    wrapper = found[: -len("model.")] if found.endswith("model.") and found != "model." else ""
    body: dict[str, str] = {}  # the rest of a name after the layers' prefix: the stored name
    other: dict[str, dict[str, str]] = {}
    # a layer's tensor under two prefixes is refused by detect(): only the few outside them here
    for n in (n for n in names if "layers." not in n):
        c = next(c for c in CANDIDATES if n.startswith(c))  # the longest ("" holds every name)
        if c == found or (not c and wrapper and n.startswith(wrapper)):
            body[n[len(c or wrapper) :]] = n
        else:
            other.setdefault(c, {})[n[len(c) :]] = n
    for c, held in other.items():
        both = sorted(set(held) & set(body))
        if both:
            raise ConfigError(
                f"{escape_name(where)}: ambiguous weight prefix: tensors under both {_said(found)} "
                f"(the layers') and {_said(c)} ({escape_name(body[both[0]])} and "
                f"{escape_name(held[both[0]])} are one weight"
                + (f", {len(both)} such weights" if len(both) > 1 else "")
                + "); keep one model per folder"
            )
    noted = {c: held for c, held in other.items() if c and not found.startswith(c)}
    if not noted:
        return ""
    return "; ".join(
        f"{len(held)} tensor(s) outside the layers under {c!r} instead (first "
        f"{escape_name(next(iter(held.values())))}): matched and served as stored"
        for c, held in noted.items()
    )


def _said(prefix: str) -> str:
    return repr(prefix) if prefix else "no prefix"


def _found(
    found: str,
    wanted: str | None,
    layers: list[int],
    mtp: bool,
    model: Mapping[str, object] | None,
    elsewhere: str = "",
) -> Prefix:
    """The prefix ``found``, its layers' indices ascending, what says MTP layers are there, and
    what lies outside the layers under another prefix."""
    words = ["MTP under 'mtp.'"] if mtp else []
    hidden = (model or {}).get("num_hidden_layers")
    if isinstance(hidden, int) and not isinstance(hidden, bool) and layers[-1] >= hidden:
        extra = [i for i in layers if i >= hidden]
        words.append(f"MTP as extra layers {extra[0]}..{extra[-1]} (num_hidden_layers {hidden})")
    return Prefix(found, wanted, len(layers), "; ".join(words), elsewhere)


def config_prefix(globs: Iterable[str]) -> str | None:
    """The prefix a config's globs are written for, read off them: the literal text before
    ``layers.`` in a glob (``model.layers.61.*``), else ``model.`` when a glob starts with it; None
    (prefix-blind)."""
    globs = list(globs)
    for g in globs:
        m = _LAYER.match(g.replace("*", "0"))
        if m and m.group(1) in CANDIDATES and "[" not in m.group(1) and "*" not in g[: m.end(1)]:
            return m.group(1)
    return "model." if any(g.startswith("model.") for g in globs) else None

"""One engine worker's load, for any serving engine: options from the engine's extra config, the
load on the engine's groups, the hand-off to the engine's own weight loaders, and one verdict.

The load itself (:func:`tpload.load`) already ends the same way on every rank. The hand-off can
still fail on one worker (an engine loader asking for bytes outside the window, a parameter left
unfilled), so its outcome goes through one more all-gather on the CPU group: every worker raises
the same message, or none does. Nothing here creates a process group.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import cast

import psutil
import torch
import torch.distributed as dist

import tpload

from ..loading.pick import model_config
from ..loading.shards import RankShards
from ..model.errors import LoadError, OptionsError
from ..model.text import escape_name
from ..model.values import SIGNER_FIELDS, JsonObject
from ..options.load_options import LoadKwargs, LoadOptions
from ..report.memory import MemoryPeaks
from ..report.render import LoadReport
from ..selection.kvscales import census
from ..storage.files import atomic_write
from .gguf_names import GGUFHandoff, is_gguf
from .handoff import Handoff, unconsumed_message
from .skips import Skip, declared_skips

MIB = 1 << 20
OPTIONS = (
    "config",
    "verify",
    "skip",
    "skip_activation_scales",
    "hash_threads",
    "samples",
    "timeout_s",
    "evict_page_cache",
    "reserve_gib",
    "report",
    "digest_store",
    "manifest_sha256",
    *SIGNER_FIELDS,
    "attest",
    "attest_key",
    "device",
)
"""The keys an engine's extra config may give (LoadOptions' fields; the rest is the engine's to
set)."""

Weights = Iterator[tuple[str, torch.Tensor]]


def load_options(
    extra: Mapping[str, object],
    *,
    world: int,
    engine_device: torch.device,
    skips: Sequence[Skip] = (),
) -> LoadKwargs:
    """tpload's load() keywords from an engine's extra config: the keys in OPTIONS, checked as
    ``load()`` checks its keywords (one OptionsError naming every bad key), plus what the engine
    fixes (stored bytes, tp = its TP size, the declared ``skips`` it never loads left unread).

    ``device``: where the windows are staged before the engine's loaders copy them into its
    parameters: ``cpu`` (default: like the engines' own loaders, and no second copy of the
    weights on the GPU) or ``engine`` (the engine's device for this worker)."""
    unknown = sorted(set(extra) - set(OPTIONS))
    if unknown:
        raise OptionsError(
            f"model loader extra config: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} (tpload takes: {', '.join(OPTIONS)})"
        )
    given = {k: v for k, v in extra.items() if k != "device"}
    device = extra.get("device", "cpu")
    try:
        checked = LoadOptions.from_values(given)
    except OptionsError as e:
        raise OptionsError(f"model loader extra config: {e}") from None
    if device not in ("cpu", "engine"):
        raise OptionsError(
            f"model loader extra config: device {device!r} is neither 'cpu' nor 'engine'"
        )
    held = asdict(checked)
    opts = {k: held[k] for k in given}
    unread = tuple(s.glob for s in skips if not s.read)
    # the keys are LoadOptions' fields, their values as LoadOptions checked them
    return cast(
        LoadKwargs,
        {
            **opts,
            "kind": "packed",
            "tp": world,
            "ep": 1,
            "progress": False,
            "device": "cpu" if device == "cpu" else str(engine_device),
            "skip": tuple(dict.fromkeys(unread + tuple(opts.get("skip", ())))),
        },
    )


class EngineLoad:
    """One worker's load into an engine (see the module docstring)."""

    def __init__(
        self,
        engine: str,
        checkpoint: str,
        extra: JsonObject,
        *,
        group: dist.ProcessGroup,
        cpu_group: dist.ProcessGroup,
        rank: int,
        world: int,
        engine_device: torch.device,
        log: logging.Logger,
    ) -> None:
        self.engine, self.checkpoint, self.extra = engine, checkpoint, extra
        self.group, self.cpu_group, self.rank, self.world = group, cpu_group, rank, world
        self.engine_device, self.log = engine_device, log

    def run(
        self,
        load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], set[str] | None],
        expected: set[str] | None,
        *,
        skips: Sequence[Skip] | None = None,
        gguf_names: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """Load, hand every window to ``load_weights`` (the engine's), check that ``expected``
        parameters were all filled and that every handed tensor was read (but those ``skips``
        excuses), and agree on the outcome with every worker.

        ``gguf_names``: for a GGUF checkpoint, the engine's {GGUF name: its name} map, built when
        needed (integrations/gguf_names.py: vLLM's GGUF names and ``qweight``/``qweight_type``
        entries).

        ``skips``: what the engine's load_weights ignores on purpose, declared by its integration
        (default: :func:`~tpload.integrations.skips.declared_skips` of the checkpoint's
        config.json)."""
        rss0 = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        with MemoryPeaks() as mem:
            skips = tuple(
                declared_skips(_model_config(self.checkpoint)) if skips is None else skips
            )
            opts = load_options(
                self.extra, world=self.world, engine_device=self.engine_device, skips=skips
            )
            report_path = LoadOptions.from_values(
                {
                    "report": opts.pop("report", None),  # written below,
                    "checkpoint": self.checkpoint,
                }
            ).report
            # once, with the hand-off's figures (checked as load() checks it)
            shards = tpload.load(
                self.checkpoint, group=self.group, cpu_group=self.cpu_group, **opts
            )
            t1 = time.perf_counter()
            problem, handed, excused = self._hand_off(
                shards, load_weights, expected, skips, gguf_names
            )
            shards.release()
        mine = {
            "rank": self.rank,
            "problem": problem,
            "handed": handed,
            "windows_bytes": shards.report.mine.bytes_read,
            "rss_rise": max(0, mem.rss_peak - rss0),
            "handoff_s": round(time.perf_counter() - t1, 4),
            "excused": excused,
        }
        everyone = self._gather(mine)
        skipped = _skipped(skips, everyone)
        if report_path and self.rank == 0:
            self._write_report(report_path, shards.report, everyone, skipped, load_s=t1 - t0)
        bad = [r for r in everyone if r["problem"]]
        if bad:
            raise LoadError(
                f"tpload hand-off to {self.engine} failed on rank "
                f"{', '.join(str(r['rank']) for r in bad)} of {self.world}; the engine must not "
                "serve:" + "".join(f"\nrank {r['rank']}: {r['problem']}" for r in bad)
            )
        self._say(shards.report, everyone, skipped, load_s=t1 - t0)

    def _hand_off(
        self,
        shards: RankShards,
        load_weights: Callable[[Weights], Iterable[str] | None],
        expected: set[str] | None,
        skips: Sequence[Skip],
        gguf_names: Callable[[], Mapping[str, str]] | None = None,
    ) -> tuple[str, int, dict[str, list[str]]]:
        """The windows into the engine's loaders: (why not, or "", tensors taken, {declared skip's
        glob: the handed tensors it excused from being read})."""
        state = shards.state_dict()
        handoff: Handoff
        if gguf_names is not None and is_gguf(shards.plan.items):
            try:  # the engine's GGUF names (gguf_names.py); an unnamed tensor is refused here
                handoff = GGUFHandoff(state, shards.plan.items, rank=self.rank, names=gguf_names())
            except LoadError as e:
                return str(e), 0, {}
            except Exception as e:  # noqa: BLE001 (transformers building the model: every worker must hear it)
                return (
                    (
                        f"GGUF hand-off: {self.engine}'s GGUF name map could not be built: "
                        f"{type(e).__name__}: {escape_name(e)}"
                    ),
                    0,
                    {},
                )
        else:
            # vLLM's attention layers take FP8 KV scales under one spelling (selection/kvscales.py):
            # hand them so
            rename = census(state).engine_names() if self.engine == "vllm" else None
            handoff = Handoff(state, shards.plan.items, rank=self.rank, rename=rename)
        taken: Callable[[], int] = lambda: sum(h.taken for h in handoff.handed.values())  # noqa: E731
        try:
            loaded = load_weights(handoff.tensors())
        except LoadError as e:
            return str(e), taken(), {}
        except (
            Exception
        ) as e:  # the engine's loader (StopIteration included): any failure ends every worker
            return (
                f"{self.engine}'s weight loading raised {type(e).__name__}: {escape_name(e)}",
                taken(),
                {},
            )
        problems = []
        if expected is not None and loaded is not None:
            missing = sorted(expected - set(loaded))
            if missing:
                shown = ", ".join(missing[:8]) + (
                    f" and {len(missing) - 8} more" if len(missing) > 8 else ""
                )
                problems.append(
                    f"{len(missing)} parameter(s) of the {self.engine} model were not filled: "
                    f"{shown}"
                )
        # Whatever the engine checks (vLLM checks nothing for quantized models): every byte handed
        # over must have been read, or a loader dropped weights and the engine would serve without
        # them.
        unread, excused = handoff.unconsumed(skips)
        if unread:
            problems.append(unconsumed_message(unread, self.engine))
        return "; ".join(problems), taken(), excused

    def _gather(self, mine: JsonObject) -> list[JsonObject]:
        rows: list[JsonObject | None] = [None] * self.world
        dist.all_gather_object(rows, mine, group=self.cpu_group)
        return [r for r in rows if r is not None]

    def _say(
        self,
        report: LoadReport,
        everyone: list[JsonObject],
        skipped: list[JsonObject],
        *,
        load_s: float,
    ) -> None:
        """TP rank 0 logs the figures through the engine's logger, and what the engine skipped on
        purpose."""
        if self.rank != 0:
            return
        for s in skipped:
            if s["tensors"] or not s["read"]:
                self.log.info(
                    "tpload: %s skipped on purpose: %s (%s)",
                    self.engine,
                    ", ".join(s["tensors"]) if s["tensors"] else s["glob"],
                    s["reason"],
                )
        per_node = report.bytes_hashed_per_node()
        self.log.info(
            "tpload: %d tensors verified (%s) in %.2f s + %.2f s hand-off; read per rank %s MB; "
            "hashed per node %s MB; peak RSS rise per rank %s MiB (windows %s MiB); digests %s",
            sum(r.tensors for r in report.ranks),
            report.verify,
            load_s,
            max(r["handoff_s"] for r in everyone),
            [round(r.bytes_read / 1e6, 1) for r in report.ranks],
            [round(b / 1e6, 1) for b in per_node.values()],
            [round(r["rss_rise"] / MIB, 1) for r in everyone],
            [round(r["windows_bytes"] / MIB, 1) for r in everyone],
            [r.digest[:16] for r in report.ranks],
        )

    def _write_report(
        self,
        path: str,
        report: LoadReport,
        everyone: list[JsonObject],
        skipped: list[JsonObject],
        *,
        load_s: float,
    ) -> None:
        """The load's JSON report with the hand-off's figures under ``engine`` (a failed write is a
        warning, as for a plain load: the weights are not at stake)."""
        doc = report.to_dict()
        doc["engine"] = {
            "name": self.engine,
            "load_s": round(load_s, 4),
            "ranks": everyone,
            "skipped": skipped,
        }
        try:
            atomic_write(Path(path), json.dumps(doc, indent=2) + "\n")
        except OSError as e:
            self.log.warning(
                "tpload: could not write the report %s: %s", escape_name(path), e.strerror
            )


def _skipped(skips: Sequence[Skip], everyone: list[JsonObject]) -> list[JsonObject]:
    """The report's list of declared skips: glob, reason, whether tpload read them, and the handed
    tensors each excused on some rank (never-read ones are not handed: the load's skip covers
    them)."""
    out = []
    for s in skips:
        names = sorted({n for r in everyone for n in r["excused"].get(s.glob, ())})
        out.append({"glob": s.glob, "reason": s.reason, "read": s.read, "tensors": names})
    return out


def _model_config(checkpoint: str) -> JsonObject:
    """config.json, or {} when there is none or it is unreadable (the load itself then says why)."""
    try:
        return model_config(Path(checkpoint)) or {}
    except LoadError:
        return {}

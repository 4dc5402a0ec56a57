"""The worker side of vLLM's weight-transfer backend ``tpload``: a trainer's new weights into a
running engine, checked on receipt, all or nothing (docs/refresh.md, docs/engines.md).

vLLM creates one :class:`TploadWeightTransferEngine` per worker when it starts with
``weight_transfer_config=WeightTransferConfig(backend="tpload")`` (the plugin registers it lazily:
this module, which imports vLLM, is imported only then). It wraps a
:class:`~tpload.refresh.engine.RefreshReceiver` and fits it to vLLM 0.32's worker RPCs, whose
rules were found the hard way (/work/notes/refresh-research.md, summarised where they bite):

* **Only the last TP rank raises.** vLLM's ``MultiprocExecutor.collective_rpc`` reads the workers'
  replies in rank order and stops at the first failure, leaving the others' replies queued for the
  *next* RPC; a failure raised on every rank therefore breaks every later round. The verdict is
  the same on every rank (the receiver's exchange), each rank ends its own session, and one raises.
* **Each rank ends vLLM's session itself.** ``Worker.update_weights`` clears its
  ``_weight_update_active`` only on a rank that raised; vLLM gives the engine no reference to its
  worker, so it is captured once, in ``init_transfer_engine``, from the caller's frame (private
  API, pinned to vLLM 0.32 by the engine tests).
* **finish never raises.** A raise there leaves vLLM's session active for good. It commits through
  vLLM's layerwise reload (the CPU build repacks linear weights, so an in-place copy is impossible)
  only after the unanimous verdict, since ``initialize_layerwise_reload`` moves layers to the meta
  device; a commit that fails after that marks the engine failed and its model refuses to run.
* **No torch.accelerator.** The base class's ``update_weights`` synchronises it, which raises on
  a CPU-only torch; the override has nothing asynchronous to wait for (gloo is synchronous, and
  a CUDA receive is synchronised by the receiver before its checks).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

from ..model.errors import LoadError
from ..model.text import escape_name
from ..model.values import JsonObject
from .engine_objects import VllmConfig, VllmModelConfig, VllmWeightTransferConfig, VllmWorker
from .vllm import TploadModelLoader

if TYPE_CHECKING:
    from ..refresh import RefreshCheck
    from ..refresh.engine import RefreshReceiver
    from ..refresh.rendezvous import RefreshKey
    from ..selection.config import Config

log = init_logger("vllm.tpload.refresh")


@dataclass
class TploadInitInfo(WeightTransferInitInfo):
    """What the trainer's sender passes to ``init_weight_transfer_engine``: the rendezvous of a
    fresh transfer group (tpload.refresh.rendezvous.Rendezvous's fields, JSON-native)."""

    host: str
    port: int
    trainer_ranks: int
    engine_ranks: int
    timeout_s: float
    session: str = ""
    token: str = field(default="", repr=False)
    """The group's secret when no refresh key is used (never in a repr or a log)."""
    proof: str = ""


@dataclass
class TploadUpdateInfo(WeightTransferUpdateInfo):
    """One ``update_weights`` call: the version the trainer sends (checked against the version
    manifest and the version served) and whether it is the round's last call, which brings the
    verdict."""

    version: int
    final: bool = True


class TploadWeightTransferEngine(WeightTransferEngine[TploadInitInfo, TploadUpdateInfo]):
    """One vLLM worker's end of a verified refresh (see the module docstring)."""

    init_info_cls = TploadInitInfo
    update_info_cls = TploadUpdateInfo
    supports_draft_weight_update = False  # an MTP draft's load_weights checks completeness itself

    def __init__(
        self,
        config: VllmWeightTransferConfig,
        vllm_config: VllmConfig,
        device: torch.device,
        model: torch.nn.Module,
    ) -> None:
        super().__init__(config, vllm_config, device, model)
        from vllm.distributed import get_pp_group, get_tp_group

        if get_pp_group().world_size > 1 or self.parallel_config.data_parallel_size > 1:
            # raised in vLLM's load_model: the engine start fails, before any trainer is waiting
            raise ValueError(
                "weight transfer backend 'tpload' refreshes tensor-parallel workers only; "
                f"pipeline_parallel_size {get_pp_group().world_size} and data_parallel_size "
                f"{self.parallel_config.data_parallel_size} must be 1"
            )
        tp = get_tp_group()
        self.rank, self.world = tp.rank_in_group, tp.world_size
        self.checkpoint = TploadModelLoader._checkpoint(self.model_config)
        # tpload's rules: not ``self.config``, the base class's WeightTransferConfig
        self.rules, self.model_doc = _config_of(self.checkpoint)
        self.table = _served_table(self.checkpoint, self.model_config)
        self.check, self.public_key, self.key = _engine_check()
        self.receiver: RefreshReceiver | None = None
        self.worker: VllmWorker | None = None
        self.verdict: int | None = None  # the version staged and agreed by every rank
        self.served_version = 0
        self.refused = ""  # the last round's refusal (the line every rank agreed on)
        self.failed = ""  # why the model refuses to run: a commit failed after the verdict

    # ------------------------------------------------------------------ the four phases

    def init_transfer_engine(self, init_info: TploadInitInfo) -> None:
        """A new trainer: end whatever the last one left (a session, staged windows, its group),
        then join the new transfer group; engine rank 0 sends the trainer this engine's layout."""
        from vllm.distributed import get_tp_group

        from ..refresh import RefreshError
        from ..refresh.engine import RefreshReceiver
        from ..refresh.layout import EngineLayout
        from ..refresh.rendezvous import Rendezvous

        try:
            rv = Rendezvous.from_json(dict(vars(init_info)))
            # proven before anything live is touched: an init from a process without the refresh
            # key (vLLM's init arrives over plain HTTP) leaves the session, staging and group
            rv.secret(self.key, who="the engine")
        except RefreshError as e:  # the same on every rank: raised on one (the module docstring)
            self._say(f"init_weight_transfer_engine refused: {e}")
            return
        self._capture_worker()
        self._end_session()
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        layout = EngineLayout(
            self.rules.id(),
            self.world,
            1,
            "packed",
            self.world,
            config=self.rules.name,
            model=self.model_doc,
        )
        receiver = RefreshReceiver(
            rank=self.rank,
            world=self.world,
            exchange_group=get_tp_group().cpu_group if self.world > 1 else None,
            layout=layout,
            config=self.rules,
            device=torch.device("cpu"),  # staged in host memory, as vLLM's own loader reads
            served_version=self.served_version,
            table=self.table,
            check=self.check,
            public_key=self.public_key,
            key=self.key,
            allow_nonfinite=os.environ.get(NONFINITE_ENV) == "1",
        )
        t0 = time.perf_counter()
        receiver.connect(rv)
        self.receiver = receiver
        log.info(
            "tpload refresh: TP rank %d joined the transfer group at %s:%d in %.2f s",
            self.rank,
            init_info.host,
            init_info.port,
            time.perf_counter() - t0,
        )

    def start_weight_update(self) -> None:
        """Clears the staging area; touches no parameter. Refused mid-round (a second start while
        an update is being received): that round goes on."""
        from ..refresh import RefreshError

        if self.receiver is not None:
            try:
                self.receiver.start()
            except RefreshError as e:  # every rank is mid-round alike: raised on one
                self._say(str(e))
                return
        self.verdict, self.refused = None, ""

    def update_weights(self, update_info: JsonObject) -> None:
        """Stage and check this call's windows; the final call brings the verdict of every rank.
        On a failure every rank drops what it staged and ends vLLM's session, and only the last
        TP rank raises (the module docstring says why)."""
        from ..refresh import RefreshError

        try:
            info, unreadable = self.parse_update_info(update_info), ""
        except ValueError as e:  # the same payload on every rank: the same verdict
            info, unreadable = TploadUpdateInfo(version=-1), escape_name(e)
        try:
            self.receive_weights(info)
            if unreadable:
                raise RefreshError(f"refresh refused: {unreadable}")
        except RefreshError as e:  # the same line on every rank, from the receiver's exchange
            self._refuse(str(e))

    def receive_weights(self, update_info: TploadUpdateInfo) -> None:
        from ..refresh import RefreshError

        if self.receiver is None:
            raise RefreshError(
                "refresh refused: update_weights before init_weight_transfer_engine (no transfer "
                "group); the served version is unchanged"
            )
        self.receiver.receive(final=update_info.final)  # drains the round whatever its info
        if not update_info.final:
            return
        manifest = self.receiver.version
        # the same on every rank: one update info, one manifest, one verdict
        if update_info.version != manifest and update_info.version >= 0:
            raise RefreshError(
                f"refresh refused: update_weights names version {update_info.version}, the "
                f"version manifest {manifest}; the served version {self.served_version} is "
                "unchanged"
            )
        failed = self._failed_anywhere()
        if failed:
            raise RefreshError(f"refresh refused: this engine is failed ({failed}); restart it")
        self.verdict = manifest

    def _failed_anywhere(self) -> str:
        """Whether a commit failed on any TP rank (each knows only its own): one answer on every
        rank, or the ranks that did not fail would commit, and vLLM's sessions would part."""
        if self.world == 1:
            return self.failed
        from vllm.distributed import get_tp_group

        rows: list[str | None] = [None] * self.world
        dist.all_gather_object(rows, self.failed, group=get_tp_group().cpu_group)
        return next((f"TP rank {r}: {f}" for r, f in enumerate(rows) if f), "")

    def finish_weight_update(self) -> None:
        """Commit the verified windows through vLLM's layerwise reload. Never raises (vLLM's session
        would stay active): a commit that fails marks the engine failed and its model refuses to
        run, so it never serves a mix of versions."""
        version, self.verdict = self.verdict, None
        if version is None or self.receiver is None:
            log.warning("tpload refresh: finish_weight_update without a verdict; nothing committed")
            return
        try:
            t0 = time.perf_counter()
            unread = self._commit(self.receiver)
            if unread:
                raise LoadError(unread)
            self.receiver.committed(version)
            self.served_version = version
            log.info(
                "tpload refresh: TP rank %d serves version %d (committed in %.3f s)",
                self.rank,
                version,
                time.perf_counter() - t0,
            )
        except Exception as e:  # noqa: BLE001 (whatever it was, the model is in an unknown state)
            self._fail(f"the commit of version {version} failed: {type(e).__name__}: {e}")
        finally:
            self.receiver.start()  # staging cleared, whatever happened

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    # ------------------------------------------------------------------ the parts

    def _commit(self, receiver: RefreshReceiver) -> str:
        """initialize_layerwise_reload, the windows into vLLM's own load_weights, finalize; then
        what the loaders left unread ("" when every handed tensor was read whole)."""
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from .handoff import Handoff, unconsumed_message
        from .vllm import _skips

        handoff = Handoff(receiver.state(), receiver.items, rank=self.rank)
        initialize_layerwise_reload(self.model)
        self.model.load_weights(handoff.tensors())
        finalize_layerwise_reload(self.model, self.model_config)
        missing, _ = handoff.unconsumed(_skips(self.model_config))
        return unconsumed_message(missing, "vllm") if missing else ""

    def _capture_worker(self) -> None:
        """vLLM's Worker that called ``init_transfer_engine`` (Worker.init_weight_transfer_engine ->
        this engine): vLLM gives the engine no reference to it, and its session flag must be
        cleared on the ranks that do not raise."""
        from vllm.v1.worker.gpu_worker import Worker

        frame = sys._getframe(1)
        for _ in range(6):
            caller = frame.f_locals.get("self")
            if isinstance(caller, Worker):
                self.worker = caller
                return
            if frame.f_back is None:
                break
            frame = frame.f_back
        log.warning("tpload refresh: vLLM's worker not found; a failed round may leave its session")

    def _end_session(self) -> None:
        """End vLLM's weight-update session on this rank (a failed round, or one a dead trainer
        left open) and drop anything staged."""
        if self.worker is not None:
            self.worker._weight_update_active = False
        self.reset_weight_update_target()
        self.verdict = None
        if self.receiver is not None:
            self.receiver.start()

    def _refuse(self, message: str) -> None:
        self.refused = message
        self._end_session()
        self._say(message)

    def _say(self, message: str) -> None:
        """A refusal every TP rank reached alike, raised on the last one only: vLLM's
        collective_rpc stops at the first failing worker and leaves the others' replies queued,
        where the next call would read them."""
        log.warning("%s", message)
        if self.rank == self.world - 1:
            raise RuntimeError(message)

    def _fail(self, why: str) -> None:
        """The model is in an unknown state: it refuses to run from now on."""
        self.failed = why
        log.error("tpload refresh: %s; this engine refuses to generate", why)

        def refuse(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"tpload refresh: {why}; this engine refuses to generate")

        self.model.forward = refuse


def _config_of(checkpoint: str) -> tuple[Config, JsonObject | None]:
    """tpload's config for the engine's checkpoint (as ``--load-format tpload`` picks it) and its
    config.json (the planner counts heads by it)."""
    from ..loading.pick import choose, model_for

    root = Path(checkpoint)
    try:
        config, _ = choose("auto", root)
    except LoadError as e:
        raise ValueError(
            f"weight transfer backend 'tpload': no tpload config for {escape_name(checkpoint)}: {e}"
        ) from None
    return config, model_for(root, config)


def _served_table(
    checkpoint: str, model_config: VllmModelConfig
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors the engine serves, as its checkpoint stores them (name -> dtype, shape), but
    those vLLM's main model never loads (MTP layers): a version must send exactly these, since a
    tensor left out would be served from uninitialised memory by vLLM's layerwise reload."""
    from ..refresh.tensors import table_of
    from .vllm import _skips

    never = [s for s in _skips(model_config) if not s.read]
    return {n: t for n, t in table_of(checkpoint).items() if not any(s.matches(n) for s in never)}


CHECK_ENV, KEY_ENV = "TPLOAD_REFRESH_CHECK", "TPLOAD_REFRESH_PUBLIC_KEY"
REFRESH_KEY_ENV = "TPLOAD_REFRESH_KEY"
NONFINITE_ENV = "TPLOAD_REFRESH_ALLOW_NONFINITE"


def _engine_check() -> tuple[RefreshCheck, str | None, RefreshKey | None]:
    """The weakest check this engine accepts, the public key every version manifest must be
    signed for, and the refresh key (read now: a bad file fails the engine's start)
    (docs/threat-model.md): the engine's own settings, from its environment (the key's path,
    never the key), since vLLM's WeightTransferConfig carries the backend's name only, and a key
    the trainer sent would vouch for nothing."""
    import os

    from ..refresh import RefreshCheck

    given = os.environ.get(CHECK_ENV, "fingerprint")
    try:
        check = RefreshCheck(given)
    except ValueError:
        raise ValueError(
            f"{CHECK_ENV}={escape_name(given)}: expected one of "
            f"{', '.join(c.value for c in RefreshCheck)}"
        ) from None
    key = os.environ.get(KEY_ENV) or None
    if key is not None and not Path(key).is_file():
        raise ValueError(f"{KEY_ENV}={escape_name(key)}: no such file")
    from ..refresh.rendezvous import RefreshKey

    shared = os.environ.get(REFRESH_KEY_ENV) or None
    return check, key, RefreshKey.read(shared) if shared is not None else None

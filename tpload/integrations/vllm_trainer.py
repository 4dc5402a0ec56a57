"""The trainer side of vLLM's weight-transfer backend ``tpload``, and the clients it drives.

    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory, ModuleSource
    from tpload.integrations.vllm_trainer import TploadTrainerInitInfo, LLMWeightSync

    trainer = WeightTransferTrainerFactory.trainer_init(
        TploadTrainerInitInfo(rank=rank), client=LLMWeightSync(llm), source=ModuleSource(model))
    trainer.send_weights(version=step)          # on every trainer rank

Importing this module registers the trainer engine with vLLM's trainer factory (a trainer that
never builds an ``LLM`` never runs vLLM's plugins); tpload's plugin registers both sides too, and
every registration is guarded, since vLLM's registries refuse a name twice.

One round (:meth:`TploadTrainerEngine.send_weights`, every trainer rank): the sender pauses an
HTTP server's generation (``/pause``, which also clears its prefix cache), calls
``start_weight_update``, then ``update_weights`` in a thread (it blocks until the workers have
the verdict) while every trainer rank sends its windows; on success ``finish_weight_update`` with
``str(version)``, so vLLM's ``weight_version`` (``/weight_info``) names it; ``/resume`` after the
finish or the failure. A failure is one :class:`~tpload.refresh.RefreshError` on every trainer
rank, carrying the engine's own line; finish is then not called and the engine serves what it
served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch.distributed as dist
from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferInitRequest,
    WeightTransferUpdateRequest,
)

from ..model.text import escape_name
from ..model.values import JsonObject
from .engine_objects import VllmLLM, VllmWeightSource, VllmWeightSyncClient

if TYPE_CHECKING:
    from ..refresh.terms import RoundFigures

BACKEND = "tpload"  # tpload.integrations.vllm.REFRESH_BACKEND
log = logging.getLogger("tpload.refresh")


@dataclass
class TploadTrainerInitInfo(TrainerInitInfo):
    """tpload's trainer init info: ``TploadTrainerInitInfo(rank=r)`` is enough on one machine.

    ``engine_ranks``: the engine's workers (None: asked of the client: an :class:`LLMWeightSync`
    knows, an HTTP server answers ``/get_world_size``). ``trainer_ranks`` / ``trainer_group``: the
    trainer's ranks and a process group over them (None: torch.distributed's default group when
    it is initialised, else one rank). ``check``: ``fingerprint`` (default: the loader's
    fingerprints catch a window corrupted or lost in transport) or ``sha256`` (a sha256 per
    window in the version manifest; with ``signer_key``, signed: a hostile wire is caught too;
    docs/threat-model.md). ``key``: the refresh key's path (a 0600 file; the engine is given the
    same one as ``TPLOAD_REFRESH_KEY``): only its holders join the transfer group, and an init
    call without its proof is refused (docs/refresh.md). ``timeout_s``: the transfer group's,
    below the HTTP client's 300 s."""

    backend: ClassVar[str] = BACKEND
    engine_ranks: int | None = None
    trainer_ranks: int | None = None
    trainer_group: dist.ProcessGroup | None = None
    check: str = "fingerprint"
    signer_key: str | None = None
    key: str | None = None
    host: str = "127.0.0.1"
    timeout_s: float = 120.0


class TploadTrainerEngine(TrainerWeightTransferEngine[TploadTrainerInitInfo]):
    """One trainer rank's end of vLLM's ``tpload`` backend (see the module docstring)."""

    init_info_cls = TploadTrainerInitInfo
    version: int
    """The last version sent (0: none yet)."""
    stale: bool
    """The last round broke the transfer group on some rank: the next one connects anew."""

    @classmethod
    def trainer_init(
        cls,
        init_info: TploadTrainerInitInfo,
        *,
        client: VllmWeightSyncClient,
        source: VllmWeightSource | None = None,
    ) -> TploadTrainerEngine:
        """Every trainer rank: the sender opens the rendezvous and calls the engine's
        ``init_weight_transfer_engine`` in a thread (it blocks until the workers joined) while it
        joins; the other ranks learn the rendezvous through the trainer's group and join."""
        from ..refresh import RefreshCheck, RefreshError
        from ..refresh.trainer import RefreshSender

        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        group = init_info.trainer_group
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        ranks = init_info.trainer_ranks or (dist.get_world_size(group) if group is not None else 1)
        world = os.environ.get("WORLD_SIZE", "1")
        if group is None and ranks == 1 and world.isdigit() and int(world) > 1:
            raise RefreshError(
                f"trainer rank {init_info.rank}: WORLD_SIZE is {world} but torch.distributed is "
                "not initialised: call torch.distributed.init_process_group() before "
                "trainer_init, or pass trainer_ranks and trainer_group"
            )
        engine.group, engine.version, engine.timeout_s = group, 0, init_info.timeout_s
        engine.sender = RefreshSender(
            rank=init_info.rank,
            trainer_ranks=ranks,
            trainer_group=group,
            check=RefreshCheck(init_info.check),
            key=init_info.key,
            signer_key=init_info.signer_key,
            timeout_s=init_info.timeout_s,
        )
        engine.engine_ranks = (
            _engine_ranks(client, init_info.engine_ranks) if engine.is_sender else 0
        )
        engine.stale = False
        engine._connect()
        return engine

    def _connect(self) -> None:
        """A fresh transfer group (every trainer rank; the engine drops whatever it staged)."""
        rv = self.sender.rendezvous(engine_ranks=self.engine_ranks)
        if not self.is_sender:
            self.layout = self.sender.connect(rv)
            return
        exe = ThreadPoolExecutor(1, thread_name_prefix="tpload-init-rpc")
        try:
            rpc = exe.submit(self.client.init_weight_transfer_engine, rv.to_dict())
            self.layout = self.sender.connect(rv)
            _result(rpc, self.timeout_s, "init_weight_transfer_engine")
        finally:
            exe.shutdown(wait=False)  # a worker stuck in its join would hang a join of the thread

    def send_weights(self, *, version: int | None = None) -> RoundFigures | None:
        """One round, on every trainer rank: the version ``version`` (default: one more than the
        last sent) of the source's tensors. Returns the sender's figures; raises one
        :class:`~tpload.refresh.RefreshError` on every trainer rank when the engine refused it
        (nothing committed, the old version still served)."""
        from ..refresh import RefreshError

        if self.source is None:
            raise ValueError("tpload's trainer engine sends a WeightSource: pass source=")
        version = self.version + 1 if version is None else version
        if self.stale:  # the last round broke the transfer group on some rank: a new one
            self._connect()
            self.stale = False
        problem, figures = "", None
        if not self.is_sender:
            try:
                figures = self.sender.send(self.source, version=version)
            except Exception as e:  # noqa: BLE001 (every trainer rank must hear it)
                problem = _line(e)
                self.sender.close()  # the engine ranks waiting on this rank fail now
        else:
            problem, figures = self._drive(version)
        problems = self._agree(problem)
        if problems:
            raise RefreshError(problems)
        self.version = version
        return figures

    def _drive(self, version: int) -> tuple[str, RoundFigures | None]:
        """The sender's round through the client's four methods: (why it failed or "", its
        figures)."""
        figures: RoundFigures | None = None
        _pause(self.client)
        try:
            try:
                self.client.start_weight_update()
            except Exception as e:  # noqa: BLE001
                return f"start_weight_update: {_engine_line(e)}", None
            exe = ThreadPoolExecutor(1, thread_name_prefix="tpload-update-rpc")
            try:
                rpc = exe.submit(self.client.update_weights, {"version": version, "final": True})
                try:
                    figures = self.sender.send(self.source, version=version)
                    sent = ""
                except Exception as e:  # noqa: BLE001
                    sent = _line(e)  # the cause, whatever the engine says of it
                    self.sender.close()  # the engine ranks waiting on this rank fail now
                try:
                    _result(rpc, self.timeout_s + 30, "update_weights")
                except Exception as e:  # noqa: BLE001
                    # the engine's verdict first (the same line on every engine rank), then what
                    # this rank's send met: a lost peer, or a cause on the trainer's side
                    # the sender raises the engines' own verdict when it got one (unlike
                    # vLLM's HTTP error, its text is not sanitised); else the engine's line, then
                    # what this rank's send met: a lost peer, or a cause on the trainer's side
                    if sent.startswith("refresh refused"):
                        return sent, figures
                    engine = _engine_line(e)
                    if sent and engine not in sent and sent not in engine:
                        engine += f"; trainer rank 0: {sent}"
                    return engine, figures
                if sent:
                    return sent, figures
            finally:
                exe.shutdown(wait=False)
            try:
                self.client.finish_weight_update(str(version))
            except Exception as e:  # noqa: BLE001
                return f"finish_weight_update: {_engine_line(e)}", figures
            return "", figures
        finally:
            _resume(self.client)

    def _agree(self, problem: str) -> str:
        """Every trainer rank's problem, so each raises the same line (or none does); and whether
        the transfer group broke on any rank (a lost peer closes it), so every rank opens a new
        one before the next round, or none does."""
        mine = (problem, self.sender.group is None or self.sender.group.broken is not None)
        if self.group is None or dist.get_world_size(self.group) == 1:
            self.stale = mine[1]
            return problem
        rows: list[tuple[str, bool]] = [("", False)] * dist.get_world_size(self.group)
        try:
            dist.all_gather_object(rows, mine, group=self.group)
        except Exception as e:  # noqa: BLE001 (a trainer rank died: this one says what it saw)
            self.stale = True
            lost = f"the trainer's group lost a rank ({_line(e)})"
            return f"{problem}; {lost}" if problem else lost
        self.stale = any(broken for _, broken in rows)
        bad = [(r, p) for r, (p, _) in enumerate(rows) if p]
        if len({p for _, p in bad}) == 1:
            first: str = bad[0][1]
            return first
        return "; ".join(f"trainer rank {r}: {p}" for r, p in bad)

    def shutdown(self) -> None:
        self.sender.close()


class LLMWeightSync:
    """vLLM's four-method ``VLLMWeightSyncClient`` over an in-process ``LLM``, whose methods take
    request envelopes (``{"init_info": ...}``), not the protocol's dicts. After a finish it resets
    the prefix cache: the cached KV blocks were computed by the old weights (an HTTP server's
    ``/pause`` clears it instead)."""

    def __init__(self, llm: VllmLLM) -> None:
        self.llm = llm

    def engine_ranks(self) -> int:
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        return int(parallel.world_size * parallel.data_parallel_size)

    def init_weight_transfer_engine(self, init_info: JsonObject) -> None:
        self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: JsonObject | list[JsonObject]) -> None:
        self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)
        self.llm.reset_prefix_cache()


def _engine_ranks(client: VllmWeightSyncClient, given: int | None) -> int:
    if given is not None:
        return given
    if isinstance(client, LLMWeightSync):
        return client.engine_ranks()
    base = getattr(client, "base_url", None)
    if isinstance(base, str):
        import requests

        r = requests.get(f"{base}/get_world_size", timeout=30)
        r.raise_for_status()
        return int(r.json()["world_size"])
    raise ValueError(
        "tpload's trainer init info: engine_ranks is needed for a client that is neither an "
        "LLMWeightSync nor vLLM's HTTP client (TploadTrainerInitInfo(rank=..., engine_ranks=N))"
    )


def _pause(client: VllmWeightSyncClient) -> None:
    """An HTTP server stops generating before the round (and clears its prefix cache): requests in
    flight are aborted and new ones wait for :func:`_resume`, so none mixes versions."""
    base = getattr(client, "base_url", None)
    if isinstance(base, str):
        import requests

        requests.post(f"{base}/pause", timeout=60).raise_for_status()


def _resume(client: VllmWeightSyncClient) -> None:
    base = getattr(client, "base_url", None)
    if isinstance(base, str):
        import requests

        try:
            requests.post(f"{base}/resume", timeout=60).raise_for_status()
        except requests.RequestException as e:
            log.warning("tpload refresh: /resume failed: %s", e)


def _result(future: Future[object], timeout: float, what: str) -> None:
    try:
        future.result(timeout=timeout)
    except FutureTimeout:
        raise TimeoutError(f"{what} did not return in {timeout:.0f} s") from None


def _engine_line(e: BaseException) -> str:
    """The engine's own message: an HTTP error's body (``{"error": {"message": ...}}``), or the
    LLM's exception, without vLLM's wrapping."""
    response = getattr(e, "response", None)
    text = ""
    if response is not None:
        try:
            body = response.json()
            text = body["error"]["message"] if isinstance(body, Mapping) else ""
        except (ValueError, KeyError, TypeError):
            text = getattr(response, "text", "")[:2000]
    text = text or str(e)
    # vLLM wraps a worker's error: "Call to collective_rpc method failed: Worker failed with error
    # '<the worker's message>', please check the stack trace above for the root cause"
    head, tail = "Worker failed with error '", "', please check"
    start, end = text.find(head), text.rfind(tail)
    if 0 <= start < end:
        text = text[start + len(head) : end]
    return _line(text)


def _line(e: BaseException | str) -> str:
    """One line: the first of the message (an exception's type when it has none)."""
    text = str(e).strip() or type(e).__name__
    return escape_name(text.splitlines()[0])


def register_trainer() -> None:
    """Make ``tpload`` known to vLLM's trainer factory (safe to call many times)."""
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, TploadTrainerEngine)


register_trainer()  # a trainer that never runs vLLM's plugins (the module docstring says why)

__all__ = ["LLMWeightSync", "TploadTrainerEngine", "TploadTrainerInitInfo", "register_trainer"]

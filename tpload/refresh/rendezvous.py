"""The refresh's own process group: a fresh torch.distributed group of trainer ranks and engine
ranks, never the engine's default one (vLLM's TP groups stay its own), and the framing spoken over
it.

The trainer's rank 0 opens a TCPStore on a free port (:func:`open_rendezvous`); the address travels
to the engine in its init call and to the other trainer ranks over the trainer's own group; every
member then :func:`join`\\ s a gloo group (CPU) or an NCCL group (CUDA) built directly on a
PrefixStore of that store, with an explicit timeout: nothing global is touched, and no wait of the
transfer can outlast it. Group ranks: the trainer ranks first, then the engine ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..model.text import escape_name
from .terms import MAX_MESSAGE_BYTES, MAX_TIMEOUT_S, TIMEOUT_S, RefreshError

_STORE_PREFIX = "tpload-refresh/"


@dataclass(frozen=True)
class Rendezvous:
    """Where the transfer group meets (JSON-able: it travels in the engine's init call)."""

    host: str
    port: int
    trainer_ranks: int
    engine_ranks: int
    timeout_s: float = TIMEOUT_S
    """Every wait of the transfer, in seconds (below vLLM's HTTP client's 300 s)."""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.host, str)
            and self.host
            and type(self.port) is int
            and 0 < self.port < 65536
            and all(type(n) is int and n >= 1 for n in (self.trainer_ranks, self.engine_ranks))
            and isinstance(self.timeout_s, int | float)
            and 0 < self.timeout_s <= MAX_TIMEOUT_S
        ):
            raise RefreshError(
                f"rendezvous {escape_name(repr(asdict(self)))[:300]}: expected a host, a port, "
                f"trainer and engine rank counts >= 1, and a timeout in (0, {MAX_TIMEOUT_S:g}] s"
            )

    @property
    def world(self) -> int:
        return self.trainer_ranks + self.engine_ranks

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: object) -> Rendezvous:
        if isinstance(doc, str | bytes):
            try:
                doc = json.loads(doc)
            except ValueError:
                doc = None
        if not isinstance(doc, dict):
            raise RefreshError(f"rendezvous: expected a JSON object, got {type(doc).__name__}")
        try:
            return cls(**doc)
        except TypeError as e:
            raise RefreshError(f"rendezvous: {escape_name(str(e))}") from None


def open_rendezvous(
    *,
    trainer_ranks: int,
    engine_ranks: int,
    host: str = "127.0.0.1",
    timeout_s: float = TIMEOUT_S,
) -> tuple[Rendezvous, dist.TCPStore]:
    """A store on a free port of ``host`` (the trainer's rank 0 holds it: keep the store object
    alive for the group's life) and the rendezvous naming it."""
    store = dist.TCPStore(
        host,
        0,
        world_size=None,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return Rendezvous(host, int(store.port), trainer_ranks, engine_ranks, float(timeout_s)), store


def join(
    rv: Rendezvous,
    group_rank: int,
    *,
    device: torch.device,
    store: dist.Store | None = None,
) -> TransferGroup:
    """Join the transfer group as ``group_rank`` (trainer ranks first, engine ranks after): gloo on
    a CPU ``device``, NCCL on a CUDA one. ``store``: the store :func:`open_rendezvous` made (its
    holder passes it; everyone else connects to the address)."""
    if not 0 <= group_rank < rv.world:
        raise RefreshError(f"rendezvous: group rank {group_rank} is not in 0..{rv.world - 1}")
    timeout = datetime.timedelta(seconds=rv.timeout_s)
    try:
        if store is None:
            store = dist.TCPStore(
                rv.host, rv.port, world_size=None, is_master=False, timeout=timeout,
                wait_for_workers=False,
            )  # fmt: skip
        prefixed = dist.PrefixStore(_STORE_PREFIX, store)
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg: dist.ProcessGroup = dist.ProcessGroupNCCL(prefixed, group_rank, rv.world, opts)
        else:
            pg = dist.ProcessGroupGloo(prefixed, group_rank, rv.world, timeout)
    except (RuntimeError, ValueError, OSError, AttributeError) as e:  # no NCCL in this torch
        raise RefreshError(
            f"group rank {group_rank}: could not join the transfer group at "
            f"{escape_name(rv.host)}:{rv.port} within {rv.timeout_s:g} s ({_first(e)})"
        ) from None
    return TransferGroup(pg, store, group_rank, rv, device)


_SOURCE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")
"""gloo's and c10d's source location, which leads their messages."""


def _first(e: BaseException) -> str:
    """The exception's first line, without torch's source location and advice."""
    text = str(e).splitlines()[0] if str(e) else ""
    text = _SOURCE.sub("", text).split(". This is typically caused", 1)[0]
    return f"{type(e).__name__}: {escape_name(text)[:300]}"


class PeerLost(RefreshError):
    """A peer of the transfer group died, hung or closed it (the group is unusable after)."""


class TransferGroup:
    """One member of the transfer group: point-to-point messages with a deadline each.

    Every message is a tensor sent to one peer; a wait that fails or outlasts the timeout raises
    :class:`PeerLost` naming the peer (a trainer killed mid-update reads as a closed connection on
    gloo, a hung one as the timeout). Device tensors travel on NCCL; host buffers are staged
    through the device there."""

    def __init__(
        self,
        pg: dist.ProcessGroup,
        store: dist.Store,
        rank: int,
        rv: Rendezvous,
        device: torch.device,
    ) -> None:
        self.pg: dist.ProcessGroup | None = pg
        self.store, self.rank, self.rv, self.device = store, rank, rv, device
        self.timeout = datetime.timedelta(seconds=rv.timeout_s)
        self.broken: str | None = None
        """Why the group can no longer be used (a peer lost); None while it can."""
        self._lock = threading.Lock()

    def name(self, peer: int) -> str:
        t = self.rv.trainer_ranks
        return f"trainer rank {peer}" if peer < t else f"engine rank {peer - t}"

    # -- raw tensors
    def isend(self, t: torch.Tensor, peer: int) -> dist.Work:
        return self._post(lambda pg: pg.send([self._wire(t)], peer, 0), peer, "send to")

    def irecv(self, t: torch.Tensor, peer: int) -> dist.Work:
        return self._post(lambda pg: pg.recv([t], peer, 0), peer, "receive from")

    def wait(self, work: dist.Work, peer: int, what: str) -> None:
        """Wait for ``work`` (a send to or receive from ``peer``) within the timeout."""
        try:
            if work.wait(self.timeout) is False:
                raise TimeoutError(f"no answer within {self.rv.timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError, DistBackendError, TimeoutError
            self.broken = f"{self.name(peer)} was lost during {what} ({_first(e)})"
            raise PeerLost(f"{self.name(self.rank)}: {self.broken}") from None

    def _post(
        self, post: Callable[[dist.ProcessGroup], dist.Work], peer: int, what: str
    ) -> dist.Work:
        if self.broken is not None or self.pg is None:
            raise PeerLost(f"{self.name(self.rank)}: the transfer group is broken: {self.broken}")
        try:
            return post(self.pg)
        except Exception as e:  # noqa: BLE001 - torch's types vary by backend
            self.broken = f"could not {what} {self.name(peer)} ({_first(e)})"
            raise PeerLost(f"{self.name(self.rank)}: {self.broken}") from None

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device)

    def send(self, t: torch.Tensor, peer: int, what: str) -> None:
        self.wait(self.isend(t, peer), peer, what)

    def recv_into(self, host: torch.Tensor, peer: int, what: str) -> None:
        """Receive into ``host`` (a CPU tensor): directly on gloo, through the device on NCCL."""
        if self.device.type == "cpu":
            self.wait(self.irecv(host, peer), peer, what)
            return
        wire = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        self.wait(self.irecv(wire, peer), peer, what)
        host.copy_(wire)

    # -- framed bytes: a length (int64), then the bytes
    def send_bytes(self, data: bytes, peer: int, what: str) -> None:
        self.send(torch.tensor([len(data)], dtype=torch.int64), peer, what)
        if data:
            self.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), peer, what)

    def recv_bytes(self, peer: int, what: str, *, limit: int = MAX_MESSAGE_BYTES) -> bytes:
        n = torch.zeros(1, dtype=torch.int64)
        self.recv_into(n, peer, what)
        size = int(n[0])
        if not 0 <= size <= limit:
            self.broken = f"{self.name(peer)} announced {size} bytes for {what} (at most {limit})"
            raise PeerLost(f"{self.name(self.rank)}: {self.broken}")
        if not size:
            return b""
        buf = torch.empty(size, dtype=torch.uint8)
        self.recv_into(buf, peer, what)
        return bytes(buf.numpy().tobytes())

    def send_ints(self, values: list[int], peer: int, what: str) -> None:
        self.send(torch.tensor(values, dtype=torch.int64), peer, what)

    def recv_ints(self, n: int, peer: int, what: str) -> list[int]:
        t = torch.zeros(n, dtype=torch.int64)
        self.recv_into(t, peer, what)
        return [int(v) for v in t]

    def close(self) -> None:
        """Leave the group (a peer still waiting on this rank fails at once on gloo)."""
        pg, self.pg = self.pg, None
        if self.broken is None:
            self.broken = "closed"
        if pg is not None:
            for how in ("abort", "shutdown"):  # best effort: the group is being dropped
                with contextlib.suppress(Exception):
                    getattr(pg, how, lambda: None)()

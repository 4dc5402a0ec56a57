"""The refresh's own transfer group: every pair of members joined by a TCP link of tpload's own,
authenticated before a byte of the round crosses it, and the framing spoken over it.

Why not a torch.distributed group: a TCPStore answers anyone who connects (a stranger on the host
can list, read and overwrite its keys, and join as any rank), and gloo's pair sockets abort the
whole process (``std::terminate``) when a peer sends more than was posted. A refresh runs inside a
serving engine, so neither may be reachable by a process that does not hold the group's secret.

- **The secret.** With a refresh key (a 0600 file both sides hold, :class:`RefreshKey`), the
  rendezvous carries a ``proof`` (an HMAC of its fields under the key): a side holding the key
  refuses a rendezvous without a valid proof before it touches its live group, and the group's
  secret is derived from the key and the rendezvous's random ``session``, so a copy of the init
  call alone proves nothing. Without a key the rendezvous carries a random ``token`` that is the
  secret: whoever reads the init call can join (docs/threat-model.md, "Refresh").
- **Membership.** Trainer rank 0 listens (the hub). Each member connects to it and proves the
  secret by a challenge-response (a fresh nonce each way, HMAC-SHA256, :func:`hmac.compare_digest`);
  the hub hands each member the others' addresses, and every other pair links the same way (the
  higher rank connects to the lower). A connection that does not prove the secret within
  :data:`HANDSHAKE_S` is dropped and never holds a slot; once every link stands, every listener is
  closed.
- **Frames.** Each frame has a fixed header (kind, length, sequence number, round tag) and an HMAC
  of it under a key of the link's direction (derived from both nonces, the session and both
  ranks), checked before its length is believed; control frames (layout, manifest, verdict) carry
  an HMAC of their bytes too, so a recorded frame cannot be replayed into another round or link,
  nor reflected to its sender. A window chunk's bytes are checked by the round itself (its
  fingerprint, or sha256, against the manifest). A frame whose header fails, or whose length is
  not what the receiver posted, breaks the group with one line: nothing a peer sends can abort a
  process or make it allocate more than it asked for.

Group ranks: the trainer ranks first, then the engine ranks. Windows travel through host memory on
every device (both ends stage in host memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import queue
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum

import torch

from ..model.errors import LoadError
from ..model.text import escape_name
from ..model.values import Json
from .terms import MAX_MESSAGE_BYTES, MAX_TIMEOUT_S, TIMEOUT_S, RefreshError

log = logging.getLogger("tpload.refresh")

MAGIC = b"TPLRFSH\x02"
"""Opens every connection: the protocol and its revision (a peer of another revision is dropped
at the first read, never misread)."""
HANDSHAKE_S = 5.0
"""Seconds a new connection has to prove the secret (a stranger that says nothing is dropped)."""
MAX_PENDING = 64
"""Unproven connections handled at once; more are closed at once (a flood cannot exhaust us)."""
_NONCE = 32
_MAC = 32
_HELLO = struct.Struct("<8s16sII32s")  # magic, session, my rank, your rank, my nonce
_HEADER = struct.Struct("<B7xQQq")  # kind, length, sequence number, round tag


class Frame(IntEnum):
    CONTROL = 1
    """A message of the protocol (layout, manifest, verdict, a rank's part): HMAC'd whole."""
    CHUNK = 2
    """A window's chunk: its header HMAC'd, its bytes checked by the round (fingerprint/sha256)."""


@dataclass(frozen=True)
class RefreshKey:
    """The refresh key: a secret shared by the trainer and the engine, read from a 0600 file of
    this user (``storage/files.py``'s ``read_secret``). Its bytes never appear in a repr, a message,
    a log or a report."""

    path: str
    secret: bytes = field(repr=False, compare=False)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RefreshKey:
        from ..storage.files import read_secret

        try:
            return cls(str(path), read_secret(path, "refresh key"))
        except LoadError as e:
            raise RefreshError(str(e)) from None

    def mac(self, *parts: bytes) -> bytes:
        return _mac(self.secret, *parts)


def key_of(key: RefreshKey | str | os.PathLike[str] | None) -> RefreshKey | None:
    """A :class:`RefreshKey`, read from its path when given one (None: no key)."""
    if key is None or isinstance(key, RefreshKey):
        return key
    return RefreshKey.read(key)


def _mac(secret: bytes, *parts: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of ``parts``, each length-prefixed (no two part lists give the same input)."""
    m = hmac.new(secret, digestmod=hashlib.sha256)
    for p in parts:
        m.update(
            len(p).to_bytes(8, "little") if isinstance(p, bytes) else p.nbytes.to_bytes(8, "little")
        )
        m.update(p)
    return m.digest()


def _rank_bytes(*ranks: int) -> bytes:
    return b"".join(r.to_bytes(4, "little") for r in ranks)


@dataclass(frozen=True)
class Rendezvous:
    """Where the transfer group meets, and how its members prove they belong (JSON: it travels in
    the engine's init call). ``token``: the group's secret when no refresh key is used (never in a
    repr or message); ``proof``: the key's HMAC of the other fields when one is."""

    host: str
    port: int
    trainer_ranks: int
    engine_ranks: int
    timeout_s: float = TIMEOUT_S
    """Every wait of the transfer, in seconds (below vLLM's HTTP client's 300 s)."""
    session: str = ""
    """32 hex digits, fresh for every rendezvous: what the links' keys are bound to."""
    token: str = field(default="", repr=False)
    proof: str = ""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.host, str)
            and self.host
            and type(self.port) is int
            and 0 < self.port < 65536
            and all(type(n) is int and n >= 1 for n in (self.trainer_ranks, self.engine_ranks))
            and isinstance(self.timeout_s, int | float)
            and 0 < self.timeout_s <= MAX_TIMEOUT_S
            and _is_hex(self.session, 32)
            and (self.token == "" or _is_hex(self.token, 64))
            and (self.proof == "" or _is_hex(self.proof, 64))
            and bool(self.token) != bool(self.proof)
        ):
            shown = {k: v for k, v in self.to_dict().items() if k != "token"}
            raise RefreshError(
                f"rendezvous {escape_name(repr(shown))[:300]}: expected a host, a port, trainer "
                f"and engine rank counts >= 1, a timeout in (0, {MAX_TIMEOUT_S:g}] s, a session of "
                "32 hex digits, and either a token or a proof of 64 hex digits"
            )

    @property
    def world(self) -> int:
        return self.trainer_ranks + self.engine_ranks

    @property
    def keyed(self) -> bool:
        """Whether the trainer proved a refresh key (else the token is the secret)."""
        return bool(self.proof)

    def to_dict(self) -> dict[str, object]:
        """The fields as a JSON-native mapping (what vLLM's init call carries)."""
        return {
            "host": self.host,
            "port": self.port,
            "trainer_ranks": self.trainer_ranks,
            "engine_ranks": self.engine_ranks,
            "timeout_s": self.timeout_s,
            "session": self.session,
            "token": self.token,
            "proof": self.proof,
        }

    def to_json(self) -> str:
        """The rendezvous as JSON text (give it to the engine; it holds the token when unkeyed)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, doc: Json | bytes) -> Rendezvous:
        """The rendezvous in ``doc`` (JSON text or bytes, or a mapping such as vLLM's init info)."""
        if isinstance(doc, str | bytes):
            try:
                doc = json.loads(doc)
            except ValueError:
                doc = None
        if not isinstance(doc, dict):
            raise RefreshError(f"rendezvous: expected a JSON object, got {type(doc).__name__}")
        unknown = sorted(set(doc) - set(cls.__dataclass_fields__))
        if unknown:
            raise RefreshError(
                f"rendezvous: unexpected field(s) {escape_name(', '.join(map(str, unknown)))[:200]}"
            )
        try:
            return cls(**doc)
        except TypeError as e:
            raise RefreshError(f"rendezvous: {escape_name(str(e))[:200]}") from None

    def _claims(self) -> bytes:
        """What the proof covers: every field but the token and the proof."""
        fields = {k: v for k, v in self.to_dict().items() if k not in ("token", "proof")}
        return json.dumps(fields, sort_keys=True).encode()

    def secret(self, key: RefreshKey | None, *, who: str) -> bytes:
        """The group's secret, once this side is satisfied the rendezvous is genuine: with ``key``,
        its proof must verify (a rendezvous from a process without the key is refused here, before
        anything live is touched); without one, the token."""
        if key is not None:
            if not self.proof:
                raise RefreshError(
                    f"{who}: the rendezvous is not proven by a refresh key, and this side holds "
                    f"one ({escape_name(key.path)}): give the trainer the same key"
                )
            want = key.mac(b"tpload-refresh-rendezvous", self._claims())
            if not hmac.compare_digest(bytes.fromhex(self.proof), want):
                raise RefreshError(
                    f"{who}: the rendezvous's proof does not verify with the refresh key "
                    f"{escape_name(key.path)} (made without this key); refused before the live "
                    "group was touched"
                )
            return key.mac(b"tpload-refresh-session", bytes.fromhex(self.session))
        if not self.token:
            raise RefreshError(
                f"{who}: the trainer proves a refresh key this side was not given: give it the "
                "same key (key_file)"
            )
        return bytes.fromhex(self.token)


def _is_hex(s: Json, n: int) -> bool:
    if not isinstance(s, str) or len(s) != n:
        return False
    try:
        bytes.fromhex(s)
    except ValueError:
        return False
    return True


def new_rendezvous(
    *,
    host: str,
    port: int,
    trainer_ranks: int,
    engine_ranks: int,
    timeout_s: float,
    key: RefreshKey | None,
) -> Rendezvous:
    """A fresh rendezvous for the hub at ``host:port``: a new session, and the key's proof (or a
    random token without a key)."""
    session = secrets.token_hex(16)
    if key is None:
        return Rendezvous(
            host,
            port,
            trainer_ranks,
            engine_ranks,
            float(timeout_s),
            session,
            secrets.token_hex(32),
        )
    bare = Rendezvous(host, port, trainer_ranks, engine_ranks, float(timeout_s), session, "0" * 64)
    proof = key.mac(b"tpload-refresh-rendezvous", bare._claims()).hex()
    return Rendezvous(host, port, trainer_ranks, engine_ranks, float(timeout_s), session, "", proof)


class Hub:
    """Trainer rank 0's listening socket, where every other member first connects (keep it until
    :func:`join` has formed the group; closed then)."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if _is_v6(host) else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.bind((host, 0))
            self.sock.listen(128)
        except OSError as e:
            self.sock.close()
            raise RefreshError(f"cannot listen on {escape_name(host)} ({e.strerror})") from None
        self.port = int(self.sock.getsockname()[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _is_v6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def open_rendezvous(
    *,
    trainer_ranks: int,
    engine_ranks: int,
    host: str = "127.0.0.1",
    timeout_s: float = TIMEOUT_S,
    key: RefreshKey | str | os.PathLike[str] | None = None,
) -> tuple[Rendezvous, Hub]:
    """A hub listening on a free port of ``host`` (the trainer's rank 0 holds it and passes it to
    :func:`join`) and the rendezvous naming it: proven by ``key`` when given one."""
    hub = Hub(host)
    rv = new_rendezvous(
        host=host,
        port=hub.port,
        trainer_ranks=trainer_ranks,
        engine_ranks=engine_ranks,
        timeout_s=timeout_s,
        key=key_of(key),
    )
    return rv, hub


def member(rv: Rendezvous, r: int) -> str:
    """Group rank ``r`` by its side's name: the trainer ranks first, then the engine ranks."""
    t = rv.trainer_ranks
    return f"trainer rank {r}" if r < t else f"engine rank {r - t}"


class PeerLost(RefreshError):
    """A peer of the transfer group died, hung, closed it or broke its protocol (the group is
    unusable after)."""


class _Violation(Exception):
    """A peer's bytes are not the protocol's (the link is dropped; the text names what)."""


class _Closed(Exception):
    """The link was closed or failed (the text is the reason)."""


def _read_exact(sock: socket.socket, into: memoryview, deadline: float) -> None:
    """Fill ``into`` from ``sock`` by ``deadline`` (monotonic), or raise."""
    got, n = 0, len(into)
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer within the timeout")
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        k = sock.recv_into(into[got:], n - got)
        if k == 0:
            raise _Closed("Connection closed by peer")
        got += k


def _recv(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    _read_exact(sock, memoryview(buf), deadline)
    return bytes(buf)


@dataclass
class _Keys:
    send: bytes = field(repr=False)
    recv: bytes = field(repr=False)


def _link_keys(secret: bytes, session: bytes, c: int, a: int, nc: bytes, na: bytes) -> _Keys:
    """The two directions' keys of the link between connector ``c`` and acceptor ``a``."""
    base = _mac(secret, b"tpload-refresh-link", session, _rank_bytes(c, a), nc, na)
    return _Keys(_mac(base, b"from", _rank_bytes(c, a)), _mac(base, b"from", _rank_bytes(a, c)))


def _connect_as(
    sock: socket.socket, secret: bytes, session: bytes, me: int, peer: int, deadline: float
) -> _Keys:
    """The connector's half of the handshake: hello, check the acceptor's proof, prove ours."""
    nc = secrets.token_bytes(_NONCE)
    sock.sendall(_HELLO.pack(MAGIC, session, me, peer, nc))
    reply = _recv(sock, _NONCE + _MAC, deadline)
    na, theirs = reply[:_NONCE], reply[_NONCE:]
    want = _mac(secret, b"accept", session, _rank_bytes(me, peer), nc, na)
    if not hmac.compare_digest(theirs, want):
        raise _Violation("it did not prove the group's secret")
    sock.sendall(_mac(secret, b"connect", session, _rank_bytes(me, peer), na, nc))
    return _link_keys(secret, session, me, peer, nc, na)


def _accept_as(
    sock: socket.socket, secret: bytes, session: bytes, me: int, world: int, deadline: float
) -> tuple[int, _Keys]:
    """The acceptor's half: read the hello, prove ours, check theirs. Returns the peer's rank."""
    magic, sess, peer, you, nc = _HELLO.unpack(_recv(sock, _HELLO.size, deadline))
    if magic != MAGIC:
        raise _Violation("it does not speak this protocol")
    if not hmac.compare_digest(sess, session):
        raise _Violation("it is of another rendezvous")
    if you != me or not 0 <= peer < world or peer == me:
        raise _Violation(f"it claims group rank {peer} calling {you}")
    na = secrets.token_bytes(_NONCE)
    sock.sendall(na + _mac(secret, b"accept", session, _rank_bytes(peer, me), nc, na))
    theirs = _recv(sock, _MAC, deadline)
    want = _mac(secret, b"connect", session, _rank_bytes(peer, me), na, nc)
    if not hmac.compare_digest(theirs, want):
        raise _Violation("it did not prove the group's secret")
    keys = _link_keys(secret, session, peer, me, nc, na)
    return int(peer), _Keys(keys.recv, keys.send)


class _Work:
    """A posted send or receive; :meth:`wait` completes it (a receive reads when waited for: each
    link's frames are read in the order they were posted)."""

    def wait(self, timeout: timedelta | float | None = None) -> bool:  # pragma: no cover
        raise NotImplementedError


class _Sent(_Work):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not self.done.wait(secs):
            return False
        if self.error is not None:
            raise self.error
        return True


class _Received(_Work):
    def __init__(self, link: _Link, into: torch.Tensor, tag: int | None, timeout_s: float) -> None:
        self.link, self.into, self.tag, self.timeout_s = link, into, tag, timeout_s

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self.link.recv_chunk(self.into, self.tag, time.monotonic() + (secs or self.timeout_s))
        return True


class _Link:
    """One authenticated link to one peer: frames out through a writer thread (a send never waits
    on another peer's reads), frames in read by whoever waits for them."""

    def __init__(self, sock: socket.socket, me: int, peer: int, keys: _Keys, timeout_s: float):
        self.sock, self.me, self.peer, self.keys = sock, me, peer, keys
        sock.settimeout(timeout_s)  # the writer's sendall; reads wait with select to a deadline
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sent = 0
        self.received = 0
        self.error: str | None = None
        self._out: queue.SimpleQueue[tuple[bytes, memoryview, bytes, _Sent] | None] = (
            queue.SimpleQueue()
        )
        self._seq_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write, name=f"tpload-refresh-to-{peer}")
        self._writer.daemon = True
        self._writer.start()

    # -- out
    def post(self, kind: Frame, payload: memoryview, tag: int) -> _Sent:
        work = _Sent()
        if self.error is not None:
            work.finish(_Closed(self.error))
            return work
        with self._seq_lock:  # one sequence a direction, in the order frames are queued
            header = _HEADER.pack(kind, payload.nbytes, self.sent, tag)
            self.sent += 1
            head_mac = _mac(self.keys.send, header)
            tail = _mac(self.keys.send, head_mac, payload) if kind == Frame.CONTROL else b""
            self._out.put((header + head_mac, payload, tail, work))
        return work

    def _write(self) -> None:
        while True:
            job = self._out.get()
            if job is None:
                return
            head, payload, tail, work = job
            if self.error is not None:
                work.finish(_Closed(self.error))
                continue
            try:
                self.sock.sendall(head)
                if payload.nbytes:
                    self.sock.sendall(payload)
                if tail:
                    self.sock.sendall(tail)
            except OSError as e:
                self.error = self.error or _oserror(e)
                work.finish(_Closed(self.error))
                continue
            work.finish()

    # -- in
    def _header(self, kind: Frame, tag: int | None, deadline: float) -> tuple[int, int, bytes]:
        """The next frame's header, proven and in sequence: (length, tag, its MAC)."""
        raw = _recv(self.sock, _HEADER.size + _MAC, deadline)
        header, head_mac = raw[: _HEADER.size], raw[_HEADER.size :]
        if not hmac.compare_digest(head_mac, _mac(self.keys.recv, header)):
            raise _Violation("a frame whose authentication fails")
        got_kind, length, seq, got_tag = _HEADER.unpack(header)
        if seq != self.received:
            raise _Violation(f"frame {seq} where {self.received} was due (replayed or reordered)")
        self.received += 1
        if got_kind != kind:
            raise _Violation(
                f"a {_kind_name(got_kind)} frame where a {_kind_name(kind)} frame was due"
            )
        if tag is not None and got_tag != tag:
            raise _Violation(f"a frame of round {got_tag} during round {tag}")
        return length, got_tag, head_mac

    def recv_control(self, limit: int, tag: int | None, deadline: float) -> tuple[bytes, int]:
        length, got_tag, head_mac = self._header(Frame.CONTROL, tag, deadline)
        if length > limit:
            raise _Violation(f"{length} bytes announced (at most {limit})")
        payload = _recv(self.sock, length, deadline)
        tail = _recv(self.sock, _MAC, deadline)
        if not hmac.compare_digest(tail, _mac(self.keys.recv, head_mac, payload)):
            raise _Violation("a message whose authentication fails")
        return payload, got_tag

    def recv_chunk(self, into: torch.Tensor, tag: int | None, deadline: float) -> None:
        if self.error is not None:
            raise _Closed(self.error)
        try:
            length, _, _ = self._header(Frame.CHUNK, tag, deadline)
            view = _bytes_of(into)
            if length != view.nbytes:
                raise _Violation(f"a chunk of {length} bytes where {view.nbytes} were posted")
            _read_exact(self.sock, view, deadline)
        except (_Violation, _Closed, TimeoutError, OSError) as e:
            self.fail(e)
            raise

    def fail(self, e: BaseException) -> None:
        self.error = self.error or _reason(e)

    def close(self) -> None:
        self.error = self.error or "closed"
        self._out.put(None)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def _kind_name(kind: int) -> str:
    try:
        return Frame(kind).name.lower()
    except ValueError:
        return f"unknown ({kind})"


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes as a writable flat memoryview (no copy)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise RefreshError("the transfer group moves contiguous host tensors only")
    return memoryview(t.view(torch.uint8).numpy().reshape(-1))


def _oserror(e: OSError) -> str:
    return f"{type(e).__name__}: {escape_name(e.strerror or str(e))}"


def _reason(e: BaseException) -> str:
    if isinstance(e, _Violation):
        return f"it broke the protocol: {e}"
    if isinstance(e, TimeoutError):
        return "no answer within the timeout"
    if isinstance(e, OSError):
        return _oserror(e)
    return escape_name(str(e))[:300]


class TransferGroup:
    """One member of the transfer group: messages to and from each peer with a deadline each.

    A wait that fails, outlasts the timeout, or meets a frame that is not the protocol's raises
    :class:`PeerLost` naming the peer, and the group is broken for good (every link closed, so no
    peer waits on this member past that moment). ``tag``: the round (version) every frame sent
    carries and every chunk received must carry."""

    def __init__(self, links: dict[int, _Link], rank: int, rv: Rendezvous) -> None:
        self.links, self.rank, self.rv = links, rank, rv
        self.timeout = timedelta(seconds=rv.timeout_s)
        self.broken: str | None = None
        """Why the group can no longer be used (a peer lost); None while it can."""
        self.tag = 0

    def name(self, peer: int) -> str:
        return member(self.rv, peer)

    def _link(self, peer: int, what: str) -> _Link:
        if self.broken is not None:
            raise PeerLost(f"{self.name(self.rank)}: the transfer group is broken: {self.broken}")
        link = self.links.get(peer)
        if link is None:
            raise PeerLost(f"{self.name(self.rank)}: no link to {self.name(peer)} for {what}")
        return link

    def _lost(self, peer: int, what: str, e: BaseException) -> PeerLost:
        self.broken = f"{self.name(peer)} was lost during {what} ({_reason(e)})"
        self.close()
        return PeerLost(f"{self.name(self.rank)}: {self.broken}")

    # -- chunks (a window's bytes)
    def isend(self, t: torch.Tensor, peer: int) -> _Work:
        return self._link(peer, "a chunk").post(Frame.CHUNK, _bytes_of(t), self.tag)

    def irecv(self, t: torch.Tensor, peer: int, *, tag: int | None = None) -> _Work:
        """Post a receive of exactly ``t``'s bytes (a chunk of another length breaks the group)."""
        return _Received(self._link(peer, "a chunk"), t, tag, self.rv.timeout_s)

    def wait(self, work: _Work, peer: int, what: str) -> None:
        """Wait for ``work`` (a send to or receive from ``peer``) within the timeout."""
        try:
            if work.wait(self.timeout) is False:
                raise TimeoutError("no answer within the timeout")
        except (_Violation, _Closed, TimeoutError, OSError, RefreshError) as e:
            raise self._lost(peer, what, e) from None

    # -- control messages
    def send_bytes(self, data: bytes, peer: int, what: str) -> None:
        if len(data) > MAX_MESSAGE_BYTES:
            raise RefreshError(
                f"{what}: {len(data)} bytes, over the protocol's {MAX_MESSAGE_BYTES}"
            )
        work = self._link(peer, what).post(Frame.CONTROL, memoryview(data), self.tag)
        self.wait(work, peer, what)

    def recv_bytes(
        self, peer: int, what: str, *, limit: int = MAX_MESSAGE_BYTES, tag: int | None = None
    ) -> bytes:
        """The next control message from ``peer``: its announced length checked against ``limit``
        before a byte is allocated; ``tag``: the round it must belong to (None: any)."""
        return self.recv_tagged(peer, what, limit=limit, tag=tag)[0]

    def recv_tagged(
        self, peer: int, what: str, *, limit: int = MAX_MESSAGE_BYTES, tag: int | None = None
    ) -> tuple[bytes, int]:
        link = self._link(peer, what)
        try:
            return link.recv_control(limit, tag, time.monotonic() + self.rv.timeout_s)
        except (_Violation, _Closed, TimeoutError, OSError) as e:
            link.fail(e)
            raise self._lost(peer, what, e) from None

    def close(self) -> None:
        """Leave the group (a peer still waiting on this member fails at once)."""
        self.broken = self.broken or "closed"
        for link in self.links.values():
            link.close()


def join(
    rv: Rendezvous,
    group_rank: int,
    *,
    key: RefreshKey | str | os.PathLike[str] | None = None,
    hub: Hub | None = None,
) -> TransferGroup:
    """Join the transfer group as ``group_rank`` (trainer ranks first, engine ranks after): prove
    the group's secret (from ``key``, or the rendezvous's token) to every other member and have
    them prove it. ``hub``: the one :func:`open_rendezvous` made (trainer rank 0 passes it; every
    other member connects to its address). Windows cross in host memory on every device. Returns
    once every link stands, or raises
    :class:`RefreshError` by the rendezvous's timeout."""
    who = f"group rank {group_rank}"
    if not 0 <= group_rank < rv.world:
        raise RefreshError(f"rendezvous: {who} is not in 0..{rv.world - 1}")
    if (group_rank == 0) != (hub is not None):
        raise RefreshError(f"rendezvous: {who}: only group rank 0 (trainer rank 0) holds the hub")
    secret = rv.secret(key_of(key), who=who)
    deadline = time.monotonic() + rv.timeout_s
    forming = _Forming(rv, group_rank, secret, deadline)
    try:
        return forming.form(hub)
    except BaseException:
        forming.drop()
        raise
    finally:
        if hub is not None:
            hub.close()


class _Forming:
    """One member's part in forming the group (see the module doc)."""

    def __init__(self, rv: Rendezvous, rank: int, secret: bytes, deadline: float) -> None:
        self.rv, self.rank, self.secret, self.deadline = rv, rank, secret, deadline
        self.session = bytes.fromhex(rv.session)
        self.links: dict[int, _Link] = {}

    def name(self, r: int) -> str:
        return member(self.rv, r)

    def form(self, hub: Hub | None) -> TransferGroup:
        world = self.rv.world
        if self.rank == 0:
            assert hub is not None  # noqa: S101 - checked by join
            self._accept(hub.sock, set(range(1, world)))
            ports = {}
            for r in range(1, world):
                ports[r] = int.from_bytes(self._hear(r, 8, "its address"), "little")
            addresses = [["", 0]] + [
                [str(self.links[r].sock.getpeername()[0]), ports[r]] for r in range(1, world)
            ]
            raw = json.dumps(addresses).encode()
            for r in range(1, world):
                self._say(r, raw, "the roster")
        else:
            listener = self._listener() if self.rank < world - 1 else None
            try:
                self._connect(0, self.rv.host, self.rv.port)
                port = listener.getsockname()[1] if listener is not None else 0
                self._say(0, port.to_bytes(8, "little"), "its address")
                roster = _roster(self._hear(0, 80 * world, "the roster"), world)
                higher = set(range(self.rank + 1, world))
                accepted = threading.Thread(
                    target=self._accept_quietly, args=(listener, higher), daemon=True
                )
                if listener is not None:
                    accepted.start()
                for r in range(1, self.rank):
                    self._connect(r, *roster[r])
                if listener is not None:
                    accepted.join(max(0.0, self.deadline - time.monotonic()) + 1)
                    if self._accept_error:
                        raise self._accept_error
                    missing = sorted(higher - set(self.links))
                    if missing:
                        raise RefreshError(self._never_joined(missing))
            finally:
                if listener is not None:
                    listener.close()
        group = TransferGroup(dict(self.links), self.rank, self.rv)
        self.links = {}
        return group

    _accept_error: BaseException | None = None

    def _accept_quietly(self, listener: socket.socket, wanted: set[int]) -> None:
        try:
            self._accept(listener, wanted)
        except BaseException as e:  # noqa: BLE001 - handed to the forming thread, which raises it
            self._accept_error = e

    def _say(self, peer: int, data: bytes, what: str) -> None:
        """A control message of the forming (the roster's), by the forming's deadline."""
        work = self.links[peer].post(Frame.CONTROL, memoryview(data), 0)
        try:
            if not work.wait(max(0.0, self._left())):
                raise TimeoutError("no answer within the timeout")
        except (_Closed, TimeoutError, OSError) as e:
            raise RefreshError(self._lost(peer, what, _reason(e))) from None

    def _hear(self, peer: int, limit: int, what: str) -> bytes:
        try:
            return self.links[peer].recv_control(limit, 0, self.deadline)[0]
        except (_Violation, _Closed, TimeoutError, OSError) as e:
            raise RefreshError(self._lost(peer, what, _reason(e))) from None

    def _lost(self, peer: int, what: str, why: str) -> str:
        return f"{self.name(self.rank)}: {self.name(peer)} was lost during {what} ({why})"

    def _listener(self) -> socket.socket:
        family = socket.AF_INET6 if _is_v6(self.rv.host) else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        any_host = "::" if family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 - peers on other hosts
        try:
            s.bind((self.rv.host if _is_loopback(self.rv.host) else any_host, 0))
            s.listen(128)
        except OSError as e:
            s.close()
            raise RefreshError(f"{self.name(self.rank)}: cannot listen ({e.strerror})") from None
        return s

    def _connect(self, peer: int, host: str, port: int) -> None:
        """Connect to ``peer`` and run the handshake (retried while the peer is not yet
        listening)."""
        last = ""
        while time.monotonic() < self.deadline:
            try:
                sock = socket.create_connection(
                    (host, port), timeout=max(0.1, min(HANDSHAKE_S, self._left()))
                )
            except OSError as e:
                last = _oserror(e)
                time.sleep(0.05)
                continue
            try:
                keys = _connect_as(
                    sock, self.secret, self.session, self.rank, peer,
                    min(self.deadline, time.monotonic() + HANDSHAKE_S),
                )  # fmt: skip
            except (_Violation, _Closed, TimeoutError, OSError) as e:
                sock.close()
                raise RefreshError(
                    f"{self.name(self.rank)}: {self.name(peer)} at {escape_name(host)}:{port} "
                    f"refused this member or is not it ({_reason(e)}): the rendezvous's secret "
                    "differs, or the slot is someone else's"
                ) from None
            self.links[peer] = _Link(sock, self.rank, peer, keys, self.rv.timeout_s)
            return
        raise RefreshError(
            f"{self.name(self.rank)}: could not reach {self.name(peer)} at {escape_name(host)}:"
            f"{port} within {self.rv.timeout_s:g} s ({last or 'no answer'})"
        )

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _accept(self, listener: socket.socket, wanted: set[int]) -> None:
        """Accept until every rank in ``wanted`` proved itself, each connection's handshake in a
        thread of its own (a stranger that stalls holds nothing); strangers are dropped."""
        lock = threading.Lock()
        pending: list[threading.Thread] = []
        refused: list[str] = []  # the first few reasons, and how many in all (a flood's list
        count = [0]  # would otherwise grow with it)

        def note(why: str) -> None:
            with lock:
                if len(refused) < 8:
                    refused.append(why)
                count[0] += 1

        def welcome(sock: socket.socket, addr: str) -> None:
            try:
                peer, keys = _accept_as(
                    sock, self.secret, self.session, self.rank, self.rv.world,
                    min(self.deadline, time.monotonic() + HANDSHAKE_S),
                )  # fmt: skip
            except (_Violation, _Closed, TimeoutError, OSError, struct.error) as e:
                note(f"{addr}: {_reason(e)}")
                sock.close()
                return
            with lock:
                if peer in wanted and peer not in self.links:
                    self.links[peer] = _Link(sock, self.rank, peer, keys, self.rv.timeout_s)
                    return
            note(f"{addr}: {self.name(peer)}, whose slot is taken or not here")
            sock.close()

        listener.settimeout(0.2)
        while True:
            with lock:
                if wanted <= set(self.links):
                    break
            if self._left() <= 0:
                with lock:
                    missing = sorted(wanted - set(self.links))
                raise RefreshError(self._never_joined(missing, count[0]))
            try:
                sock, addr = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                raise RefreshError(
                    f"{self.name(self.rank)}: accept failed ({e.strerror})"
                ) from None
            pending = [t for t in pending if t.is_alive()]
            if len(pending) >= MAX_PENDING:
                sock.close()
                continue
            sock.settimeout(HANDSHAKE_S)
            t = threading.Thread(target=welcome, args=(sock, escape_name(addr[0])), daemon=True)
            t.start()
            pending.append(t)
        if refused:
            log.warning(
                "%s: refused %d connection(s) that did not prove the group's secret (first: %s)",
                self.name(self.rank), count[0], refused[0],
            )  # fmt: skip

    def _never_joined(self, missing: list[int], refused: int = 0) -> str:
        names = ", ".join(self.name(r) for r in missing[:8])
        more = f" ({refused} connection(s) refused: not proven)" if refused else ""
        return (
            f"{self.name(self.rank)}: {names} did not join the transfer group within "
            f"{self.rv.timeout_s:g} s{more}"
        )

    def drop(self) -> None:
        for link in self.links.values():
            link.close()
        self.links = {}


def _roster(raw: bytes, world: int) -> list[tuple[str, int]]:
    """Every member's listening address, as the hub sent it (authenticated: from trainer rank 0)."""
    doc = json.loads(raw)
    out = [(str(ipaddress.ip_address(h)) if h else "", int(p)) for h, p in doc]
    if len(out) != world:
        raise RefreshError(f"the roster names {len(out)} members, the group has {world}")
    return out


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

"""The refresh's own transfer group (refresh/rendezvous.py), in threads of this process over real
sockets: a rendezvous that travels as JSON text and never shows its secret, membership that must
be proven (a stranger on the hub or on a member's port holds no slot and aborts nothing), frames
whose lengths are checked before any allocation, recorded frames that cannot be replayed or
reflected, and waits that end with the peer named instead of hanging."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from tpload.refresh import rendezvous as wire
from tpload.refresh.rendezvous import (
    PeerLost,
    RefreshKey,
    Rendezvous,
    TransferGroup,
    join,
    open_rendezvous,
)
from tpload.refresh.terms import RefreshError


def _key(tmp_path: Path, name: str = "refresh.key", mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    return path


def test_a_rendezvous_travels_as_json_text_and_never_shows_its_token() -> None:
    rv, hub = open_rendezvous(trainer_ranks=2, engine_ranks=2, timeout_s=30.0)
    hub.close()
    text = rv.to_json()
    assert isinstance(text, str)
    assert Rendezvous.from_json(text) == rv == Rendezvous.from_json(rv.to_dict())
    assert rv.token and rv.token not in repr(rv) and rv.world == 4 and not rv.keyed
    bad = dict(rv.to_dict(), port=0)
    with pytest.raises(RefreshError, match="rendezvous") as e:
        Rendezvous.from_json(bad)
    assert rv.token not in str(e.value)  # the error names the fields, never the secret
    for field, value in (("trainer_ranks", 0), ("timeout_s", 300), ("session", "zz")):
        with pytest.raises(RefreshError, match="rendezvous"):
            Rendezvous.from_json(dict(rv.to_dict(), **{field: value}))
    with pytest.raises(RefreshError, match="unexpected field"):
        Rendezvous.from_json(dict(rv.to_dict(), x=1))
    with pytest.raises(RefreshError, match="expected a JSON object"):
        Rendezvous.from_json("[1, 2]")


def _group(
    world: int = 2,
    *,
    trainers: int = 1,
    timeout_s: float = 10.0,
    key: Path | None = None,
    keys: dict[int, Path | None] | None = None,
) -> tuple[dict[int, TransferGroup], dict[int, BaseException]]:
    """Every member of a fresh group joined in its own thread: (groups, errors) by group rank."""
    rv, hub = open_rendezvous(
        trainer_ranks=trainers, engine_ranks=world - trainers, timeout_s=timeout_s, key=key
    )
    out: dict[int, TransferGroup] = {}
    errors: dict[int, BaseException] = {}

    def member(r: int) -> None:
        k = (keys or {}).get(r, key)
        try:
            out[r] = join(rv, r, key=k, hub=hub if r == 0 else None)
        except RefreshError as e:
            errors[r] = e

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    return out, errors


def _close(groups: dict[int, TransferGroup]) -> None:
    for g in groups.values():
        g.close()


def test_framed_messages_cross_every_pair_and_a_silent_peer_is_named_within_the_timeout() -> None:
    groups, errors = _group(3, trainers=1, timeout_s=3.0)
    assert not errors, errors
    try:
        for a in range(3):
            for b in range(3):
                if a != b:
                    got: dict[str, bytes] = {}

                    def take(a: int = a, b: int = b, got: dict[str, bytes] = got) -> None:
                        got["b"] = groups[b].recv_bytes(a, "m")

                    t = threading.Thread(target=take)
                    t.start()
                    groups[a].send_bytes(f"hello {a}->{b} \x00".encode(), b, "m")
                    t.join()
                    assert got["b"] == f"hello {a}->{b} \x00".encode()
        assert groups[0].name(0) == "trainer rank 0" and groups[0].name(2) == "engine rank 1"
        started = time.monotonic()
        with pytest.raises(PeerLost, match="engine rank 0: trainer rank 0 was lost during the x"):
            groups[1].recv_bytes(0, "the x")  # nothing comes: the timeout ends the wait
        assert time.monotonic() - started < 10
        with pytest.raises(PeerLost, match="the transfer group is broken"):
            groups[1].recv_bytes(0, "anything")  # a broken group is not used again
    finally:
        _close(groups)


def test_an_announced_length_over_the_limit_is_refused_before_any_allocation() -> None:
    groups, errors = _group()
    assert not errors, errors
    try:
        sender: list[BaseException] = []

        def send() -> None:
            try:
                groups[0].send_bytes(b"x" * 2_000_000, 1, "a manifest")
            except PeerLost as e:  # the receiver dropped the link: what a sender then sees
                sender.append(e)

        t = threading.Thread(target=send)
        t.start()
        with pytest.raises(PeerLost, match=r"2000000 bytes announced \(at most 1048576\)"):
            groups[1].recv_bytes(0, "x", limit=1 << 20)
        t.join()
        assert not sender or "engine rank 0 was lost" in str(sender[0]), sender
    finally:
        _close(groups)


def test_a_chunk_of_another_length_than_posted_breaks_the_group_not_the_process() -> None:
    """gloo aborted the whole process here (a peer sending more than was posted)."""
    groups, errors = _group()
    assert not errors, errors
    try:
        groups[0].isend(torch.ones(64, dtype=torch.uint8), 1)
        into = torch.empty(16, dtype=torch.uint8)
        with pytest.raises(PeerLost, match="a chunk of 64 bytes where 16 were posted"):
            groups[1].wait(groups[1].irecv(into, 0), 0, "a window")
        with pytest.raises(PeerLost, match="broken"):  # this member left the group; it lives
            groups[1].recv_bytes(0, "y")
    finally:
        _close(groups)


def test_a_frame_of_another_kind_or_round_is_refused() -> None:
    groups, errors = _group()
    assert not errors, errors
    try:
        groups[0].send_bytes(b"a control frame", 1, "x")
        with pytest.raises(PeerLost, match="a control frame where a chunk frame was due"):
            groups[1].wait(groups[1].irecv(torch.empty(15, dtype=torch.uint8), 0), 0, "a window")
    finally:
        _close(groups)
    groups, errors = _group()
    try:
        groups[0].tag = 7
        groups[0].send_bytes(b"v7", 1, "x")
        with pytest.raises(PeerLost, match="a frame of round 7 during round 8"):
            groups[1].recv_bytes(0, "x", tag=8)
    finally:
        _close(groups)


def _linked_pair() -> tuple[socket.socket, socket.socket, wire._Link, wire._Link]:
    """Two links over a socketpair, handshaken as members 0 and 1 (the raw sockets kept too)."""
    a, b = socket.socketpair()
    secret, session = os.urandom(32), os.urandom(16)
    deadline = time.monotonic() + 5
    got: dict[str, object] = {}
    t = threading.Thread(
        target=lambda: got.update(k=wire._accept_as(b, secret, session, 0, 2, deadline))
    )
    t.start()
    ka = wire._connect_as(a, secret, session, 1, 0, deadline)
    t.join()
    peer, kb = got["k"]  # type: ignore[misc]
    assert peer == 1
    return a, b, wire._Link(a, 1, 0, ka, 5.0), wire._Link(b, 0, 1, kb, 5.0)


def _frame(link: wire._Link, data: bytes) -> bytes:
    """The bytes ``link`` puts on the wire for a control message (read off a socketpair)."""
    x, y = socket.socketpair()
    spy = wire._Link(x, link.me, link.peer, link.keys, 5.0)
    spy.sent = link.sent
    spy.post(wire.Frame.CONTROL, memoryview(data), 0).wait(5)
    y.settimeout(5)
    raw = b""
    while len(raw) < wire._HEADER.size + wire._MAC * 2 + len(data):
        raw += y.recv(1 << 16)
    spy.close()
    y.close()
    return raw


def test_a_recorded_frame_cannot_be_replayed_reflected_or_altered() -> None:
    a, b, la, lb = _linked_pair()
    try:
        assert la.keys.send == lb.keys.recv and la.keys.send != la.keys.recv
        recorded = _frame(la, b"verdict: passed")
        a.sendall(recorded)  # first delivery: accepted
        assert lb.recv_control(100, None, time.monotonic() + 5)[0] == b"verdict: passed"
        a.sendall(recorded)  # the same bytes again: out of sequence
        with pytest.raises(wire._Violation, match="frame 0 where 1 was due"):
            lb.recv_control(100, None, time.monotonic() + 5)
    finally:
        la.close()
        lb.close()
    a, b, la, lb = _linked_pair()
    try:
        b.sendall(_frame(la, b"reflected"))  # a's own frame sent back to a
        with pytest.raises(wire._Violation, match="authentication fails"):
            la.recv_control(100, None, time.monotonic() + 5)
    finally:
        la.close()
        lb.close()
    a, b, la, lb = _linked_pair()
    try:
        raw = bytearray(_frame(la, b"abc"))
        raw[wire._HEADER.size + wire._MAC] ^= 1  # a payload byte
        a.sendall(bytes(raw))
        with pytest.raises(wire._Violation, match="message whose authentication fails"):
            lb.recv_control(100, None, time.monotonic() + 5)
    finally:
        la.close()
        lb.close()


def _strangers(port: int, stop: threading.Event, seen: list[str]) -> None:
    """What a process on the host does to a port it found: connect, say nothing, send junk, send a
    well-formed hello with a made-up session, announce an enormous frame."""
    hello = wire._HELLO.pack(wire.MAGIC, os.urandom(16), 1, 0, os.urandom(32))
    payloads = [b"", b"\xff" * 4096, hello, hello + b"\0" * 32 + (1 << 62).to_bytes(8, "little")]
    while not stop.is_set():
        for p in payloads:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    if p:
                        s.sendall(p)
                    seen.append(s.recv(64).hex() if p == hello else "")
            except OSError:
                pass


def test_strangers_on_the_hub_hold_no_slot_and_abort_nothing() -> None:
    rv, hub = open_rendezvous(trainer_ranks=1, engine_ranks=2, timeout_s=15.0)
    stop, seen = threading.Event(), []
    flood = [threading.Thread(target=_strangers, args=(rv.port, stop, seen)) for _ in range(3)]
    for t in flood:
        t.start()
    time.sleep(0.5)  # the strangers are at it before any member arrives
    out: dict[int, TransferGroup] = {}
    members = [
        threading.Thread(
            target=lambda r=r: out.update({r: join(rv, r, hub=hub if r == 0 else None)})
        )
        for r in range(3)
    ]
    for t in members:
        t.start()
    for t in members:
        t.join(30)
    stop.set()
    for t in flood:
        t.join(10)
    try:
        assert sorted(out) == [0, 1, 2]
        assert seen  # they did connect, and were answered with nothing they can use
        got = {}
        t = threading.Thread(target=lambda: got.update(x=out[2].recv_bytes(1, "x")))
        t.start()
        out[1].send_bytes(b"between members", 2, "x")
        t.join()
        assert got["x"] == b"between members"
        with pytest.raises(OSError):  # every listener closed once the group stood
            socket.create_connection(("127.0.0.1", rv.port), timeout=1).close()
    finally:
        _close(out)


def test_a_member_without_the_secret_is_refused_and_named_by_the_hub() -> None:
    rv, hub = open_rendezvous(trainer_ranks=1, engine_ranks=1, timeout_s=3.0)
    forged = Rendezvous.from_json(dict(rv.to_dict(), token="ab" * 32))
    errors: dict[int, BaseException] = {}

    def member(r: int, r_v: Rendezvous) -> None:
        try:
            join(r_v, r, hub=hub if r == 0 else None)
        except RefreshError as e:
            errors[r] = e

    threads = [
        threading.Thread(target=member, args=(0, rv)),
        threading.Thread(target=member, args=(1, forged)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert "refused this member or is not it" in str(errors[1]), errors
    assert "engine rank 0 did not join the transfer group within 3 s" in str(errors[0])
    assert "not proven" in str(errors[0])


def test_a_refresh_key_proves_the_rendezvous_and_never_appears(tmp_path: Path) -> None:
    key = _key(tmp_path)
    groups, errors = _group(key=key)
    assert not errors, errors
    _close(groups)
    rv, hub = open_rendezvous(trainer_ranks=1, engine_ranks=1, key=key)
    hub.close()
    secret = key.read_bytes()
    assert rv.keyed and not rv.token
    assert secret.hex() not in rv.to_json() and secret.hex() not in repr(RefreshKey.read(key))
    # an init from a process without the key: another key, or none, or the proof altered
    other = _key(tmp_path, "other.key")
    with pytest.raises(RefreshError, match="does not verify with the refresh key"):
        rv.secret(RefreshKey.read(other), who="engine rank 0")
    with pytest.raises(RefreshError, match="was not given: give it the same key"):
        rv.secret(None, who="engine rank 0")
    unkeyed, hub = open_rendezvous(trainer_ranks=1, engine_ranks=1)
    hub.close()
    with pytest.raises(RefreshError, match="not proven by a refresh key, and this side holds one"):
        unkeyed.secret(RefreshKey.read(key), who="engine rank 0")
    moved = Rendezvous.from_json(dict(rv.to_dict(), port=rv.port + 1 if rv.port < 65535 else 1))
    with pytest.raises(RefreshError, match="does not verify"):
        moved.secret(RefreshKey.read(key), who="engine rank 0")  # the proof covers every field


def test_a_key_file_others_may_read_is_refused_naming_it(tmp_path: Path) -> None:
    loose = _key(tmp_path, "loose.key", 0o644)
    with pytest.raises(RefreshError, match=r"loose\.key: refresh key has mode 0644"):
        RefreshKey.read(loose)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    short.chmod(0o600)
    with pytest.raises(RefreshError, match="is 8 bytes, expected 16 to 4096"):
        RefreshKey.read(short)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(RefreshError, match="is a FIFO"):
        RefreshKey.read(fifo)


def test_members_with_different_keys_never_form_a_group(tmp_path: Path) -> None:
    key, other = _key(tmp_path), _key(tmp_path, "other.key")
    groups, errors = _group(timeout_s=3.0, key=key, keys={1: other})
    _close(groups)
    assert 1 in errors and "does not verify with the refresh key" in str(errors[1])
    assert 0 in errors and "did not join" in str(errors[0])

"""The refresh's own group: a rendezvous that travels as JSON, a gloo group joined through it (two
members, in two threads of this process: real gloo, no launcher), framed messages, and waits that
end with the peer named instead of hanging."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tpload.refresh.rendezvous import PeerLost, Rendezvous, join, open_rendezvous
from tpload.refresh.terms import RefreshError


def test_a_rendezvous_travels_as_json_and_refuses_what_is_not_one() -> None:
    rv = Rendezvous("127.0.0.1", 29500, 2, 2, 30.0)
    assert Rendezvous.from_json(rv.to_json()) == rv
    assert Rendezvous.from_json('{"host": "h", "port": 1, "trainer_ranks": 1, "engine_ranks": 3}')
    assert rv.world == 4
    for bad in (
        {"host": "h", "port": 0, "trainer_ranks": 1, "engine_ranks": 1},
        {"host": "h", "port": 1, "trainer_ranks": 0, "engine_ranks": 1},
        {"host": "h", "port": 1, "trainer_ranks": 1, "engine_ranks": 1, "timeout_s": 300},
    ):
        with pytest.raises(RefreshError, match="rendezvous"):
            Rendezvous.from_json(bad)
    with pytest.raises(RefreshError, match="unexpected keyword"):
        Rendezvous.from_json(
            {"host": "h", "port": 1, "trainer_ranks": 1, "engine_ranks": 1, "x": 1}
        )
    with pytest.raises(RefreshError, match="expected a JSON object"):
        Rendezvous.from_json("[1, 2]")


def _pair(timeout_s: float = 20.0):
    """Trainer rank 0 (holding the store) and engine rank 0, joined in two threads."""
    rv, store = open_rendezvous(trainer_ranks=1, engine_ranks=1, timeout_s=timeout_s)
    assert rv.port > 0 and rv.timeout_s == timeout_s
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(1, join(rv, 1, device=torch.device("cpu"))))
    t.start()
    out[0] = join(rv, 0, device=torch.device("cpu"), store=store)
    t.join()
    return out[0], out[1], store


def test_framed_messages_cross_the_group_and_a_silent_peer_is_named_within_the_timeout() -> None:
    trainer, engine, _store = _pair(timeout_s=3.0)
    try:
        got = {}
        t = threading.Thread(target=lambda: got.update(b=engine.recv_bytes(0, "a test message")))
        t.start()
        trainer.send_bytes(b"hello \x00 world", 1, "a test message")
        t.join()
        assert got["b"] == b"hello \x00 world"
        assert trainer.name(0) == "trainer rank 0" and trainer.name(1) == "engine rank 0"
        started = time.monotonic()
        with pytest.raises(
            PeerLost, match="engine rank 0: trainer rank 0 was lost during the nothing"
        ):
            engine.recv_bytes(0, "the nothing")  # the trainer sends nothing: the timeout ends it
        assert time.monotonic() - started < 30
        assert engine.broken is not None
        with pytest.raises(PeerLost, match="the transfer group is broken"):
            engine.recv_bytes(0, "anything")  # a broken group is not used again
    finally:
        trainer.close()
        engine.close()


def test_an_announced_length_over_the_limit_is_refused_before_any_allocation() -> None:
    trainer, engine, _store = _pair()
    try:
        t = threading.Thread(target=lambda: trainer.send_ints([1 << 40], 1, "a length"))
        t.start()
        with pytest.raises(PeerLost, match=r"trainer rank 0 announced 1099511627776 bytes for x"):
            engine.recv_bytes(0, "x", limit=1 << 20)
        t.join()
    finally:
        trainer.close()
        engine.close()

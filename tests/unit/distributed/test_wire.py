"""The replicas' wire (distributed/wire.py): which group and device the messages travel on, and the
staged path a device wire takes (a copy on each side of the transfer), run here on the CPU between
two links in one process, through the same Link code a GPU load runs."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tpload.sources.replicas as replicas
from tpload.distributed.placement import Placement
from tpload.distributed.replica_split import split
from tpload.distributed.wire import Wire, device_wire
from tpload.model.errors import LoadError, StoodDown
from tpload.sources.replicas import Link

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    "backend, device, nccl",
    [
        ("cpu:gloo,cuda:nccl", CUDA, True),  # the world tpload makes under torchrun
        ("nccl", CUDA, True),  # a caller's NCCL group
        ("NCCL", CUDA, True),
        ("gloo", CUDA, False),  # a gloo group on GPUs: host tensors, as before
        ("cpu:gloo,cuda:nccl", CPU, False),  # a CPU load never sends device tensors
        ("gloo", CPU, False),
    ],
)
def test_device_tensors_go_over_the_load_s_group_only_for_a_cuda_load_with_nccl(
    backend: str, device: torch.device, nccl: bool
) -> None:
    assert device_wire(backend, device) is nccl
    assert not device_wire(backend, device, shared_device=True)  # NCCL refuses two ranks a GPU


def test_a_cpu_load_sends_host_buffers_over_its_cpu_group_without_a_copy() -> None:
    cpu_group = object()
    ctx = SimpleNamespace(device=CPU, group=object(), cpu_group=cpu_group, shared_device=False)
    wire = Wire.of(ctx)  # no dist call on the CPU: the fake groups are never asked their backend
    assert wire.group is cpu_group and wire.device == CPU and not wire.staged
    host = wire.host(64)
    buf = wire.buffer(host)
    assert buf.data_ptr() == host.ctypes.data  # the wire buffer IS the host buffer
    host[:] = 7
    sent = wire.put(host[:10], buf)
    assert sent.data_ptr() == host.ctypes.data and sent.numel() == 10
    assert wire.header([1, 2]).tolist() == [1, 2] and wire.header(size=8).tolist() == [0] * 8


class Mailbox:
    """send and recv between links of one process: a message is queued when sent, taken when a
    receive is posted (every send here comes before its receive)."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
        self.sent: list[torch.Tensor] = []
        self.done = SimpleNamespace(wait=lambda timeout=None: True)

    def send(self, tensor: torch.Tensor, group_dst: int, group: object) -> object:
        self.sent.append(tensor)
        self.queues[(group.rank, group_dst)].append(tensor.clone())
        return self.done

    def recv(self, tensor: torch.Tensor, group_src: int, group: object) -> object:
        queue = self.queues[(group_src, group.rank)]
        if not queue:  # nothing sent: a real wait would time out (a drain's read past the end)
            return SimpleNamespace(wait=self._nothing)
        tensor.copy_(queue.pop(0))
        return self.done

    @staticmethod
    def _nothing(timeout: object = None) -> bool:
        raise RuntimeError("no message within the timeout")


def _links(staged: bool) -> tuple[Link, Link]:
    at = Placement.in_order(2, 1)  # 2 replicas x 1 position: ranks 0 and 1
    (shared,) = split([[(["w"], 96, None)]], 2)
    out = []
    for rank in (0, 1):
        ctx = SimpleNamespace(rank=rank, group=None)  # no group: no stop flags in a store
        wire = Wire(SimpleNamespace(rank=rank), CPU, staged=staged)
        out.append(Link(ctx, at, [shared], 10.0, 0, wire))
    return out[0], out[1]


def _window() -> tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]:
    data = np.arange(6 * 16, dtype=np.uint8).reshape(6, 16)
    return data, [(0, 0, data[:4]), (4, 0, data[4:])]  # two pieces, as a chunked read yields


@pytest.mark.parametrize("staged", [False, True])
def test_a_window_crosses_the_wire_exactly_staged_or_not(
    staged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Mailbox()
    monkeypatch.setattr(replicas, "send", box.send)
    monkeypatch.setattr(replicas, "recv", box.recv)
    sender, receiver = _links(staged)
    data, pieces = _window()
    passed = list(sender.sending("w", ((0, 6), (0, 16)), pieces))
    assert [v.tobytes() for _, _, v in passed] == [data[:4].tobytes(), data[4:].tobytes()]
    got = np.zeros_like(data)
    for r, c, view in receiver.receiving("w", ((0, 6), (0, 16)), 0):
        got[r : r + view.shape[0], c : c + view.shape[1]] = view
    assert np.array_equal(got, data) and receiver.problems == []
    assert sender.from_storage == receiver.from_peers == data.size
    # staged (a device wire's path): what went out is the wire buffers, apart from the host ring
    host = {b.ctypes.data for b in sender._send if b.size}
    pieces_sent = [t for t in box.sent if t.dtype == torch.uint8]
    assert len(pieces_sent) == 2
    assert all((t.data_ptr() in host) is not staged for t in pieces_sent)


@pytest.mark.parametrize("staged", [False, True])
def test_a_byte_changed_on_the_wire_is_a_problem_naming_tensor_sender_and_receiver(
    staged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    box, flipped = Mailbox(), []

    def flip(tensor: torch.Tensor, group_dst: int, group: object) -> object:
        if tensor.dtype == torch.uint8 and not flipped:  # the first piece, after its fingerprint
            flipped.append(tensor)
            tensor[-1] ^= 1
        return box.send(tensor, group_dst, group)

    monkeypatch.setattr(replicas, "send", flip)
    monkeypatch.setattr(replicas, "recv", box.recv)
    sender, receiver = _links(staged)
    _, pieces = _window()
    list(sender.sending("w", ((0, 6), (0, 16)), pieces))
    list(receiver.receiving("w", ((0, 6), (0, 16)), 0))
    (problem,) = receiver.problems
    assert problem.startswith("tensor w: the bytes rank 1 received from rank 0 (replica 0)")
    assert problem.endswith("changed in transit")


def _failing(pieces: list, after: int):
    """A window's reads that fail (an I/O error) after ``after`` pieces."""
    yield from pieces[:after]
    raise OSError(5, "Input/output error")


def test_an_owner_that_fails_mid_window_stops_its_receivers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner's loop fails after sending the first piece (a read error): abort() sends an ABORT
    header where the next piece's would be, and the receiver, waiting for it, stops with the owner
    named (errors.StoodDown: the owner's message is the cause) instead of waiting out --timeout."""
    box = Mailbox()
    monkeypatch.setattr(replicas, "send", box.send)
    monkeypatch.setattr(replicas, "recv", box.recv)
    sender, receiver = _links(False)
    sender.seq = receiver.seq = 4
    _, pieces = _window()
    with pytest.raises(OSError):
        for _ in sender.sending("w", ((0, 6), (0, 16)), _failing(pieces, 1)):
            pass
    sender.abort()  # what the loop does when it fails (loop.run)
    with pytest.raises(StoodDown) as e:  # at the ABORT it asked for ahead of the first piece's use
        list(receiver.receiving("w", ((0, 6), (0, 16)), 0))
    assert str(e.value) == (
        "replicas: stopped receiving w from rank 0 (replica 0), which failed while reading it"
    )
    assert receiver.problems == [] and not any(box.queues.values())  # every message taken
    sent = len(box.sent)
    sender.abort()  # once: nothing more is sent
    assert len(box.sent) == sent


def test_a_rank_that_fails_between_windows_ends_its_stream_and_a_stale_abort_is_out_of_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank whose loop fails between windows ends its stream with an ABORT (every stream ends
    with one, or a BYE): a peer waiting for its next window stops naming it; an ABORT of another
    call (an earlier load() on the same group) never stops this one."""
    box = Mailbox()
    monkeypatch.setattr(replicas, "send", box.send)
    monkeypatch.setattr(replicas, "recv", box.recv)
    sender, receiver = _links(False)
    sender.seq = receiver.seq = 2
    _, pieces = _window()
    list(sender.sending("w", ((0, 6), (0, 16)), pieces))  # a whole window
    sent = len(box.sent)
    sender.abort()
    assert len(box.sent) == sent + 1  # its stream's end
    list(receiver.receiving("w", ((0, 6), (0, 16)), 0))
    with pytest.raises(StoodDown) as stopped:
        list(receiver.receiving("w", ((0, 6), (0, 16)), 0))
    assert str(stopped.value) == (
        "replicas: stopped receiving w from rank 0 (replica 0), which failed"
    )
    sender.abort()
    assert len(box.sent) == sent + 1  # once
    stale, now = _links(False)
    stale.seq, now.seq = 1, 2
    stale.abort()
    with pytest.raises(LoadError, match="out of step") as e:
        list(now.receiving("w", ((0, 6), (0, 16)), 0))
    assert not isinstance(e.value, StoodDown)

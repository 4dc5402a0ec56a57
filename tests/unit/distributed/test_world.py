"""The device from LOCAL_RANK (checked, never shared by accident), node names, and the verdict that
every rank computes from the exchanged table alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tpload.distributed.world import DistContext, call_world, node_key, pick_device
from tpload.model.errors import OptionsError
from tpload.model.figures import RankFigures
from tpload.model.values import AGREED_BYTES
from tpload.planning.layout import Layout
from tpload.verification import gate, strategy


def test_the_cpu_is_picked_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert pick_device(None, 3) == torch.device("cpu")
    assert pick_device("cpu", 0) == torch.device("cpu")


@pytest.mark.parametrize(
    "device, needle",
    [
        ("bogus", "device 'bogus' is not a device (expected cpu, cuda or cuda:N)"),
        ("meta", "tpload loads onto cpu or cuda, not meta (a meta tensor holds no data)"),
        ("mps", "tpload loads onto cpu or cuda, not mps"),
    ],
)
def test_devices_tpload_cannot_load_onto_are_refused(device: str, needle: str) -> None:
    with pytest.raises(OptionsError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        pick_device(device, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_refused_by_name(device: str) -> None:
    with pytest.raises(
        OptionsError, match=f"device '{device}' asked for, but this process sees no CUDA device"
    ):
        pick_device(device, 0)


def test_node_names_come_from_the_host_and_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPLOAD_NODE_ID", raising=False)
    monkeypatch.setenv("GROUP_RANK", "0")
    a = node_key()
    monkeypatch.setenv("GROUP_RANK", "1")
    assert node_key() != a  # two agents on one host are two nodes, as torchrun counts them
    monkeypatch.setenv("TPLOAD_NODE_ID", "rack7-node3")
    assert node_key() == "id:rack7-node3"


def ctx(nodes: tuple[int, ...]) -> DistContext:
    return DistContext(0, len(nodes), 0, torch.device("cpu"), object(), object(), nodes)


def _verdict(ranks: list[RankFigures], context: DistContext, store: str) -> str:
    """The gate's verdict of a node-mode load on a manifest checkpoint, as one text ("" when
    passed)."""
    storage = SimpleNamespace(
        catalogue=SimpleNamespace(
            manifest_sha256="ab" * 32, manifest_path="/c/NATIVE_MANIFEST.json"
        ),
        per_rank=False,
        file_digests=None,
        root=Path("/nonexistent-checkpoint"),
    )
    opts = SimpleNamespace(kind="packed", digest_store=store, verify="node", checkpoint=None)
    job = strategy.Job(opts, context, storage, {}, "x", Layout(2, 1), dict)
    return "\n".join(gate.judge(ranks, gate.strategy(job)).problems)


AGREED = "0f" * (AGREED_BYTES // 2)  # what the handshake puts in a row (distributed/agreement.py)


def Job() -> str:  # noqa: N802 - the digest store the messages name
    return "/store"


def test_the_verdict_groups_failures_by_message() -> None:
    ranks = [
        RankFigures(rank=0, seq=1, failed=1, message="rank 0: boom"),
        RankFigures(rank=1, seq=1),
        RankFigures(rank=2, seq=1, failed=1, message="rank 2: boom"),
    ]
    why = _verdict(ranks, ctx((0, 0, 0)), Job())
    assert why.startswith("load failed on rank 0, 2 (2 of 3 ranks); no rank returned weights")
    assert why.count("boom") == 1 and "rank 0, 2: boom" in why


def test_ranks_in_different_calls_are_caught_before_anything_else() -> None:
    ranks = [RankFigures(rank=0, seq=2), RankFigures(rank=1, seq=1, failed=1, message="x")]
    assert "different load() calls (rank 0 in call 2, rank 1 in call 1)" in _verdict(
        ranks, ctx((0, 0)), Job()
    )


def test_a_rank_differing_from_the_stored_prediction_fails_everyone() -> None:
    ranks = [
        RankFigures(rank=0, seq=1, prediction=1, agreed=AGREED),
        RankFigures(rank=1, seq=1, prediction=2, digest="ab" * 32, agreed=AGREED),
    ]
    why = _verdict(ranks, ctx((0, 0)), Job())
    assert (
        "rank 1: digest abababababababab... differs from the prediction stored in /store/" in why
        and "(tp2-ep1-packed-config-x)" in why
    )
    assert "rank 0: digest" not in why


def test_a_clean_table_passes() -> None:
    ranks = [
        RankFigures(rank=r, seq=1, claims=[bytes(32)] * 8, seen=[bytes(32)] * 8, agreed=AGREED)
        for r in range(2)
    ]
    assert _verdict(ranks, ctx((0, 0)), Job()) == ""


def test_a_world_without_torchrun_agent_store_is_the_callers_to_make(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rank 0 would host the store, and close it under a faster peer's next call
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with (
        pytest.raises(OptionsError, match="init torch.distributed .* before load"),
        call_world(timeout_s=1),
    ):
        pass


def test_a_single_process_makes_no_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    with call_world(timeout_s=1):
        assert not torch.distributed.is_initialized()


def test_load_registers_no_exit_hook() -> None:
    import tpload.distributed.world as distributed

    assert "atexit" not in vars(distributed)  # whoever makes a group tears it down, in the call

"""The engine hand-off without an engine: window tensors serve exactly their window and refuse the
rest, the plan's cuts become the right element ranges, and a loader narrowing the way vLLM's do
(column parallel by rows, row parallel by columns, kv heads shared when fewer than ranks) gets the
bytes of the whole tensor's slice, read independently with the safetensors library."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tpload.config import load_config
from tpload.integrations.engine import OPTIONS, load_options
from tpload.integrations.handoff import HandoffError, WindowTensor, box_of, checkpoint_order, engine_skips, windows
from tpload.errors import OptionsError
from tpload.plan import Layout, Planner
from tpload.published import write_published
from tpload.storage.catalogue import read_native


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("handoff") / "llama", "llama-tiny")


def whole(root: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})
    return out


def window_tensor() -> tuple[torch.Tensor, WindowTensor]:
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    return full, WindowTensor(full[4:8].clone(), (8, 6), ((4, 8), (0, 6)), "w (rank 1)")


def test_a_window_tensor_shows_the_whole_shape_and_serves_its_window() -> None:
    full, w = window_tensor()
    assert tuple(w.shape) == (8, 6) and w.size(0) == 8 and w.dim() == 2 and w.dtype == torch.float32
    assert w.numel() == 48 and w.device.type == "cpu"
    got = w.narrow(0, 4, 4)
    assert type(got) is torch.Tensor and torch.equal(got, full[4:8])
    assert torch.equal(torch.narrow(w, 0, 5, 2), full[5:7])  # inside the window: a part of it
    part = w.narrow(1, 2, 3)  # a whole dimension narrowed first: still a window tensor of the rest
    assert isinstance(part, WindowTensor) and tuple(part.shape) == (8, 3)
    assert torch.equal(part.narrow(0, 4, 4), full[4:8, 2:5])
    assert torch.equal(w[4:8], full[4:8]) and torch.equal(w[4:6, 1:3], full[4:6, 1:3])
    assert "holds [4:8, 0:6]" in repr(w)


@pytest.mark.parametrize("attempt", [
    lambda w: w.narrow(0, 0, 4),            # another rank's rows
    lambda w: w.narrow(0, 3, 2),            # across the window's edge
    lambda w: w[0:8],
    lambda w: w + 1,
    lambda w: torch.zeros(8, 6).copy_(w),   # the whole tensor copied
    lambda w: w.t(),
    lambda w: w[2],
])
def test_a_window_tensor_refuses_bytes_it_does_not_hold(attempt) -> None:  # noqa: ANN001
    _, w = window_tensor()
    with pytest.raises(HandoffError, match=r"w \(rank 1\)|tpload window"):
        attempt(w)


def test_cuts_become_element_ranges(llama: Path) -> None:
    planner = Planner(read_native(llama)[0], load_config("llama"))
    metas = {}
    for rank in (0, 1):
        for item in planner.plan(Layout(2), "packed", rank).items:
            metas[item.weight.name] = item.fit.weight
            boxes = {c.name: box_of(c, item.fit.weight) for c in item.cuts}
            name = item.weight.name
            box = boxes[name]
            if name.endswith("q_proj.weight") or name.endswith("mlp.up_proj.weight"):
                n = metas[name].shape[0] // 2
                assert box == ((rank * n, rank * n + n), (0, metas[name].shape[1])), name
            elif name.endswith("down_proj.weight") or name.endswith("o_proj.weight"):
                k = metas[name].shape[1] // 2
                assert box == ((0, metas[name].shape[0]), (rank * k, rank * k + k)), name
            elif name.endswith("norm.weight"):
                assert box == ((0, metas[name].shape[0]),), name


def vllm_like(name: str, t: torch.Tensor, rank: int, tp: int, kv_heads: int) -> torch.Tensor:
    """What vLLM's weight loaders do with a whole checkpoint tensor (linear.py, vocab_parallel_embedding.py)."""
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        if tp <= kv_heads:
            return t.narrow(0, rank * (t.shape[0] // tp), t.shape[0] // tp)
        head = t.shape[0] // kv_heads  # fewer kv heads than ranks: each head replicated on tp / kv_heads ranks
        return t.narrow(0, (rank // (tp // kv_heads)) * head, head)
    if name.endswith(("q_proj.weight", "gate_proj.weight", "up_proj.weight", "embed_tokens.weight", "lm_head.weight")):
        return t.narrow(0, rank * (t.shape[0] // tp), t.shape[0] // tp)
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return t.narrow(1, rank * (t.shape[1] // tp), t.shape[1] // tp)
    return t


@pytest.mark.parametrize("tp", [2, 4])
def test_a_vllm_style_loader_gets_exactly_the_bytes_of_the_whole_tensors_slice(llama: Path, tp: int) -> None:
    full = whole(llama)
    planner = Planner(read_native(llama)[0], load_config("llama"))
    for rank in range(tp):
        plan = planner.plan(Layout(tp), "packed", rank)
        state = {}
        for item in plan.items:  # the rank's windows, cut here by the planner's element ranges
            for c in item.cuts:
                box = box_of(c, item.fit.weight)
                state[c.name] = full[c.name][tuple(slice(lo, hi) for lo, hi in box)].clone()
        handed = dict(windows(state, plan.items, rank=rank))
        assert set(handed) == set(full)
        for name, t in handed.items():
            got = vllm_like(name, t, rank, tp, kv_heads=2)
            want = vllm_like(name, full[name], rank, tp, kv_heads=2)
            assert type(got) is torch.Tensor and torch.equal(got, want), (name, rank)
            assert got.data_ptr() != state[name].data_ptr()  # a private copy: loaders may write into it


def test_engine_skips_the_mtp_layers_only() -> None:
    assert engine_skips({"num_hidden_layers": 61, "num_nextn_predict_layers": 1}) == ("model.layers.61.*",)
    assert engine_skips({"num_hidden_layers": 2, "num_nextn_predict_layers": 2}) == ("model.layers.2.*",
                                                                                    "model.layers.3.*")
    assert engine_skips({"num_hidden_layers": 32}) == ()


def test_engine_options_fix_what_the_engine_owns_and_refuse_unknown_keys() -> None:
    opts = load_options({"verify": "rank", "skip": "x.*"}, world=4, engine_device=torch.device("cpu"),
                        model_config={"num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    assert opts["kind"] == "packed" and opts["tp"] == 4 and opts["ep"] == 1 and opts["device"] == "cpu"
    assert opts["skip"] == ("model.layers.2.*", "x.*") and opts["verify"] == "rank"
    with pytest.raises(OptionsError, match="unknown key 'kind'.*tpload takes: " + ", ".join(OPTIONS[:3])):
        load_options({"kind": "expanded"}, world=1, engine_device=torch.device("cpu"), model_config={})
    with pytest.raises(OptionsError, match="neither 'cpu' nor 'engine'"):
        load_options({"device": "cuda:3"}, world=1, engine_device=torch.device("cpu"), model_config={})


def test_windows_come_in_the_order_vllms_default_loader_yields_tensors(llama: Path) -> None:
    """Files in natural order, names sorted within each: what vLLM's own safetensors iterator yields."""
    plan = Planner(read_native(llama)[0], load_config("llama")).plan(Layout(1), "packed", 0)
    full = whole(llama)
    names = [n for n, _ in windows(full, plan.items, rank=0)]
    want = []
    for path in sorted(llama.glob("*.safetensors")):  # 2 shards: lexical order is natural order here
        with safe_open(str(path), "pt") as f:
            want += sorted(f.keys())
    assert names == want
    assert checkpoint_order("m-00002-of-00010.safetensors", "a") < checkpoint_order("m-00010-of-00010.safetensors", "a")

"""The engine hand-off without an engine: the plan's cuts become the right element ranges, a loader
narrowing the way vLLM's do (column parallel by rows, row parallel by columns, kv heads shared when
fewer than ranks) gets the bytes of the whole tensor's slice, read independently with the
safetensors library, and what the loader read of each handed tensor is recorded: a tensor left
unread is named, unless the engine integration declared it skipped on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tpload.integrations.engine import OPTIONS, _skipped, load_options
from tpload.integrations.handoff import (
    Handoff,
    checkpoint_order,
    element_ranges,
    unconsumed_message,
    windows,
)
from tpload.integrations.skips import Skip, declared_skips
from tpload.integrations.window_tensor import WholeTensor
from tpload.loading.planner import planner_of
from tpload.model.errors import OptionsError
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published

from ...ckpt_tools import whole


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("handoff") / "llama", "llama-tiny")


def test_cuts_become_element_ranges(llama: Path) -> None:
    planner = planner_of(read_native(llama)[0], load_config("llama"))
    metas = {}
    for rank in (0, 1):
        for item in planner.plan(Layout(2), "packed", rank).items:
            metas[item.weight.name] = item.fit.weight
            held_of = {c.name: element_ranges(c, item.fit.weight) for c in item.cuts}
            name = item.weight.name
            held = held_of[name]
            if name.endswith("q_proj.weight") or name.endswith("mlp.up_proj.weight"):
                n = metas[name].shape[0] // 2
                assert held == ((rank * n, rank * n + n), (0, metas[name].shape[1])), name
            elif name.endswith("down_proj.weight") or name.endswith("o_proj.weight"):
                k = metas[name].shape[1] // 2
                assert held == ((0, metas[name].shape[0]), (rank * k, rank * k + k)), name
            elif name.endswith("norm.weight"):
                assert held == ((0, metas[name].shape[0]),), name


def vllm_like(name: str, t: torch.Tensor, rank: int, tp: int, kv_heads: int) -> torch.Tensor:
    """What vLLM's weight loaders do with a whole checkpoint tensor (linear.py,
    vocab_parallel_embedding.py)."""
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        if tp <= kv_heads:
            return t.narrow(0, rank * (t.shape[0] // tp), t.shape[0] // tp)
        head = (
            t.shape[0] // kv_heads
        )  # fewer kv heads than ranks: each head replicated on tp / kv_heads ranks
        return t.narrow(0, (rank // (tp // kv_heads)) * head, head)
    if name.endswith(
        (
            "q_proj.weight",
            "gate_proj.weight",
            "up_proj.weight",
            "embed_tokens.weight",
            "lm_head.weight",
        )
    ):
        return t.narrow(0, rank * (t.shape[0] // tp), t.shape[0] // tp)
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return t.narrow(1, rank * (t.shape[1] // tp), t.shape[1] // tp)
    return t


@pytest.mark.parametrize("tp", [2, 4])
def test_a_vllm_style_loader_gets_exactly_the_bytes_of_the_whole_tensors_slice(
    llama: Path, tp: int
) -> None:
    full = whole(llama)
    planner = planner_of(read_native(llama)[0], load_config("llama"))
    for rank in range(tp):
        plan = planner.plan(Layout(tp), "packed", rank)
        state = {}
        for item in plan.items:  # the rank's windows, cut here by the planner's element ranges
            for c in item.cuts:
                held = element_ranges(c, item.fit.weight)
                state[c.name] = full[c.name][tuple(slice(lo, hi) for lo, hi in held)].clone()
        handed = dict(windows(state, plan.items, rank=rank))
        assert set(handed) == set(full)
        for name, t in handed.items():
            got = vllm_like(name, t, rank, tp, kv_heads=2)
            want = vllm_like(name, full[name], rank, tp, kv_heads=2)
            assert type(got) in (torch.Tensor, WholeTensor) and torch.equal(got, want), (name, rank)
            assert (
                got.data_ptr() != state[name].data_ptr()
            )  # a private copy: loaders may write into it


def test_a_handoff_names_every_tensor_left_unread_and_excuses_declared_skips(llama: Path) -> None:
    full = whole(llama)
    plan = planner_of(read_native(llama)[0], load_config("llama")).plan(Layout(2), "packed", 1)
    state = {
        c.name: full[c.name][
            tuple(slice(lo, hi) for lo, hi in element_ranges(c, item.fit.weight))
        ].clone()
        for item in plan.items
        for c in item.cuts
    }
    handoff = Handoff(state, plan.items, rank=1)
    order = [name for name, _ in windows(state, plan.items, rank=1)]
    forgotten, shape_only = order[1], order[3]
    for n, (name, t) in enumerate(handoff.tensors()):
        if n == 5:
            break  # the engine stops taking weights (the 6th was taken)
        if name == forgotten:
            continue
        if name == shape_only:
            t.shape  # noqa: B018
            continue
        vllm_like(name, t, 1, 2, kv_heads=2)
    unread, excused = handoff.unconsumed([Skip("lm_head.*", "tied", read=True)])
    by = {h.name: h.what() for h in unread}
    assert "lm_head.weight" not in by and excused == {"lm_head.*": ["lm_head.weight"]}
    assert {n for n, why in by.items() if why.startswith("taken, never read")} == {
        forgotten,
        shape_only,
        order[5],
    }
    assert {n for n, why in by.items() if why == "never taken from the weights iterator"} == set(
        order[6:]
    ) - {"lm_head.weight"}
    assert set(order[:5]) - set(by) == set(order[:5]) - {
        forgotten,
        shape_only,
    }  # the rest were read whole
    message = unconsumed_message(unread, "test")
    assert (
        message.startswith(
            f"{len(unread)} tensor(s) tpload handed over were not consumed by test's weight "
            "loaders: "
        )
        and " and " in message
        and "docs/engines.md" in message
    )


def test_the_report_lists_each_declared_skip_with_its_reason_and_the_tensors_it_excused() -> None:
    skips = declared_skips(
        {"num_hidden_layers": 2, "num_nextn_predict_layers": 1, "tie_word_embeddings": True}
    )
    rows = _skipped(skips, [{"excused": {"lm_head.*": ["lm_head.weight"]}}, {"excused": {}}])
    assert rows[0] == {
        "glob": "model.layers.2.*",
        "reason": skips[0].reason,
        "read": False,
        "tensors": [],
    }
    assert rows[1] == {
        "glob": "lm_head.*",
        "reason": "tie_word_embeddings: the engine's lm_head is embed_tokens",
        "read": True,
        "tensors": ["lm_head.weight"],
    }
    assert [r["tensors"] for r in rows[2:]] == [[], [], []]


def test_engine_options_fix_what_the_engine_owns_and_refuse_unknown_keys() -> None:
    skips = declared_skips(
        {"num_hidden_layers": 2, "num_nextn_predict_layers": 1, "tie_word_embeddings": True}
    )
    opts = load_options(
        {"verify": "rank", "skip": "x.*"}, world=4, engine_device=torch.device("cpu"), skips=skips
    )
    assert (
        opts["kind"] == "packed" and opts["tp"] == 4 and opts["ep"] == 1 and opts["device"] == "cpu"
    )
    assert (
        opts["skip"] == ("model.layers.2.*", "x.*") and opts["verify"] == "rank"
    )  # handed-over skips: not load skips
    with pytest.raises(
        OptionsError, match="unknown key 'kind'.*tpload takes: " + ", ".join(OPTIONS[:3])
    ):
        load_options({"kind": "expanded"}, world=1, engine_device=torch.device("cpu"))
    with pytest.raises(OptionsError, match="neither 'cpu' nor 'engine'"):
        load_options({"device": "cuda:3"}, world=1, engine_device=torch.device("cpu"))


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"skip": 5}, "skip=: expected a glob or a list of globs, got int 5"),
        ({"skip": ["a.*", 3]}, "skip=: expected a glob or a list of globs"),
        ({"timeout_s": float("inf")}, "timeout_s="),
        ({"timeout_s": "soon"}, "timeout_s=: expected a number, got str 'soon'"),
        ({"hash_threads": 10**9}, "hash_threads= must be between 0 and 1024"),
        ({"timeout_s": 1e300}, "timeout_s= must be > 0 and at most 604800"),
        ({"verify": "everything"}, "verify= 'everything' is not one of"),
    ],
)
def test_extra_config_values_are_checked_as_load_checks_them_in_one_line(
    extra: dict, named: str
) -> None:
    with pytest.raises(OptionsError) as e:
        load_options(extra, world=2, engine_device=torch.device("cpu"))
    text = str(e.value)
    assert (
        text.startswith("model loader extra config: invalid option: ")
        and named in text
        and "\n" not in text
    )


def test_windows_come_in_the_order_vllms_default_loader_yields_tensors(llama: Path) -> None:
    """Files in natural order, names sorted within each: what vLLM's own safetensors iterator
    yields."""
    plan = planner_of(read_native(llama)[0], load_config("llama")).plan(Layout(1), "packed", 0)
    full = whole(llama)
    names = [n for n, _ in windows(full, plan.items, rank=0)]
    want = []
    for path in sorted(
        llama.glob("*.safetensors")
    ):  # 2 shards: lexical order is natural order here
        with safe_open(str(path), "pt") as f:
            want += sorted(f.keys())
    assert names == want
    assert checkpoint_order("m-00002-of-00010.safetensors", "a") < checkpoint_order(
        "m-00010-of-00010.safetensors", "a"
    )


def test_the_trust_options_pass_through_the_engines_extra_config(tmp_path: Path) -> None:
    key = tmp_path / "signer.pub.pem"
    key.write_text("-----BEGIN PUBLIC KEY-----\n")
    opts = load_options(
        {"signer_key": str(key), "signature": "none"}, world=2, engine_device=torch.device("cpu")
    )
    assert opts["signer_key"] == str(key) and opts["signature"] == "none"
    with pytest.raises(OptionsError, match="signer_cert= needs signer_chain="):
        load_options({"signer_cert": str(key)}, world=2, engine_device=torch.device("cpu"))

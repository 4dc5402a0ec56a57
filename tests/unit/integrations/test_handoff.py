"""The engine hand-off without an engine: window tensors serve exactly their window and refuse
every other access (one test per access: DLPack, numpy, storages, data_ptr, torch functions with a
window in their arguments, C code), the plan's cuts become the right element ranges, a loader
narrowing the way vLLM's do (column parallel by rows, row parallel by columns, kv heads shared when
fewer than ranks) gets the bytes of the whole tensor's slice, read independently with the
safetensors library, and what the loader read of each handed tensor is recorded: a tensor left
unread is named, unless the engine integration declared it skipped on purpose."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tpload.config import load_config
from tpload.errors import OptionsError
from tpload.integrations.engine import OPTIONS, _skipped, load_options
from tpload.integrations.handoff import (
    Handed,
    Handoff,
    HandoffError,
    Skip,
    WholeTensor,
    WindowTensor,
    _covers,
    box_of,
    checkpoint_order,
    declared_skips,
    engine_skips,
    unconsumed_message,
    windows,
)
from tpload.pick import planner_of
from tpload.plan import Layout
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published

from ...ckpt_tools import whole


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("handoff") / "llama", "llama-tiny")


def window_tensor() -> tuple[torch.Tensor, WindowTensor]:
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    return full, WindowTensor(full[4:8].clone(), (8, 6), ((4, 8), (0, 6)), "w (rank 1)")


def tracked() -> tuple[torch.Tensor, WindowTensor, Handed]:
    """A window of rows 4:8 of an 8x6 tensor whose reads are recorded."""
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    handed = Handed("w", ((4, 8), (0, 6)), whole=False)
    handed.taken = True
    return (
        full,
        WindowTensor(full[4:8].clone(), (8, 6), handed.box, "w (rank 1)", handed=handed),
        handed,
    )


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
    assert torch.equal(w[4:8, ...], full[4:8]) and torch.equal(w[..., 4:6, :], full[4:6])
    assert "holds [4:8, 0:6]" in repr(w)


@pytest.mark.parametrize(
    "attempt",
    [
        lambda w: w.narrow(0, 0, 4),  # another rank's rows
        lambda w: w.narrow(0, 3, 2),  # across the window's edge
        lambda w: w[0:8],
        lambda w: w + 1,
        lambda w: torch.zeros(8, 6).copy_(w),  # the whole tensor copied
        lambda w: w.t(),
        lambda w: w[2],
        lambda w: w[..., 0:2],  # Ellipsis first: all rows
        lambda w: w[None],
    ],
)
def test_a_window_tensor_refuses_bytes_it_does_not_hold(attempt) -> None:  # noqa: ANN001
    _, w = window_tensor()
    with pytest.raises(HandoffError, match=r"^w \(rank 1\): the engine"):
        attempt(w)


# Every way to a window's memory or to an op on all of it, and the access the message must name.
ACCESSES = {
    "torch.utils.dlpack.to_dlpack": (lambda w: torch.utils.dlpack.to_dlpack(w), "from C code"),
    "__dlpack__": (lambda w: w.__dlpack__(), "__dlpack__"),
    "__dlpack_device__": (lambda w: w.__dlpack_device__(), "__dlpack_device__"),
    "np.from_dlpack": (lambda w: np.from_dlpack(w), "__dlpack"),
    "torch.from_dlpack": (lambda w: torch.from_dlpack(w), "__dlpack"),
    "np.asarray": (lambda w: np.asarray(w), "__array__"),
    "__array__": (lambda w: w.__array__(), "__array__"),
    "numpy": (lambda w: w.numpy(), "numpy()"),
    "untyped_storage": (lambda w: w.untyped_storage(), "untyped_storage()"),
    "storage": (lambda w: w.storage(), "storage()"),
    "data_ptr": (lambda w: w.data_ptr(), "data_ptr()"),
    "tolist": (lambda w: w.tolist(), "tolist()"),
    "item": (lambda w: w.item(), "item()"),
    "torch.cat": (lambda w: torch.cat([w, torch.zeros(8, 6)]), "torch.cat"),
    "torch.cat(tensors=)": (lambda w: torch.cat(tensors=[torch.zeros(8, 6), w]), "torch.cat"),
    "torch.stack": (lambda w: torch.stack([torch.zeros(8, 6), w]), "torch.stack"),
    "torch.add": (lambda w: torch.add(torch.zeros(8, 6), w), "torch.add"),
    "x + w": (lambda w: torch.zeros(8, 6) + w, "Tensor.add"),
    "torch.tensor": (lambda w: torch.tensor(w), "from C code"),
    ".data": (lambda w: w.data, "attribute .data"),
    ".T": (lambda w: w.T, "attribute .T"),
    "__cuda_array_interface__": (lambda w: w.__cuda_array_interface__, "__cuda_array_interface__"),
    "pickle": (lambda w: pickle.dumps(w), "pickling"),
    "deepcopy": (lambda w: copy.deepcopy(w), "copy.deepcopy"),
    "Parameter": (lambda w: torch.nn.Parameter(w), "Tensor.detach"),
    "contiguous": (lambda w: w.contiguous(), "Tensor.contiguous"),
    "to": (lambda w: w.to(torch.float64), "Tensor.to"),
    "view": (lambda w: w.view(-1), "Tensor.view"),
    "iteration": (lambda w: list(w), "Tensor."),
    "bool": (lambda w: bool(w), "Tensor.__bool__"),
}


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
@pytest.mark.parametrize("access", list(ACCESSES))
def test_every_access_outside_the_allow_list_is_refused_naming_tensor_rank_and_access(
    access: str,
) -> None:
    attempt, named = ACCESSES[access]
    _, w, handed = tracked()
    with pytest.raises(HandoffError) as e:
        attempt(w)
    assert str(e.value).startswith("w (rank 1): the engine's weight loader used ") and named in str(
        e.value
    )
    assert "holds only [4:8, 0:6] of (8, 6)" in str(e.value)
    assert not handed.reads  # nothing was served


def test_a_window_in_torch_cat_under_map_raises_instead_of_ending_the_iteration_silently() -> None:
    """torch.cat([w, x]) once raised a bare StopIteration, which list(map(...)) takes for the
    end."""
    _, w, _ = tracked()
    weights = [("a", w), ("b", w)]
    calls = []

    def loader(item: tuple[str, torch.Tensor]) -> torch.Tensor:
        calls.append(item[0])
        return torch.cat([item[1], torch.zeros(8, 6)])

    with pytest.raises(HandoffError, match=r"^w \(rank 1\): .*used torch\.cat"):
        list(map(loader, weights))
    assert calls == ["a"]


def test_metadata_is_served_as_the_whole_tensors_and_is_never_a_read() -> None:
    _, w, handed = tracked()
    assert (
        w.shape == (8, 6)
        and w.size() == (8, 6)
        and w.size(1) == 6
        and w.size(-1) == 6
        and len(w) == 8
    )
    assert (
        w.dim() == 2 and w.ndim == 2 and w.numel() == 48 and w.nelement() == 48 and w.nbytes == 192
    )
    assert (
        w.dtype == torch.float32
        and w.device.type == "cpu"
        and w.element_size() == 4
        and w.itemsize == 4
    )
    assert (
        w.stride() == (6, 1) and w.is_contiguous() and w.is_floating_point() and not w.requires_grad
    )
    assert f"{w}" == repr(w) == "WindowTensor(w (rank 1), shape (8, 6), holds [4:8, 0:6])"
    assert hash(w) == hash(w)
    assert not handed.reads and not handed.consumed


def test_reads_are_recorded_and_a_window_is_consumed_once_they_cover_it() -> None:
    full, w, handed = tracked()
    assert torch.equal(w.narrow(0, 4, 2), full[4:6])
    assert (
        not handed.consumed
        and handed.what() == "only [4:6, 0:6] read of the [4:8, 0:6] this rank holds"
    )
    assert torch.equal(w[6:8], full[6:8])  # the other half (as fused gate/up loaders read a window)
    assert handed.consumed
    _, w, handed = tracked()
    cols = w.narrow(1, 0, 3)  # a whole dimension first: nothing read yet, a window of the rest
    assert isinstance(cols, WindowTensor) and not handed.reads
    cols.narrow(0, 4, 4)
    assert handed.reads == {((4, 8), (0, 3))} and not handed.consumed
    w.narrow(1, 3, 3).narrow(0, 4, 4)
    assert handed.consumed
    _, w, handed = tracked()
    w[4:8, 1:3]  # slicing both dimensions at once reads only the part asked
    assert handed.reads == {((4, 8), (1, 3))} and not handed.consumed


def test_coverage_of_a_box_by_parts() -> None:
    box = ((0, 4), (0, 6))
    assert _covers(box, [((0, 4), (0, 6))])
    assert _covers(box, [((0, 2), (0, 6)), ((2, 4), (0, 3)), ((1, 4), (3, 6))])
    assert not _covers(
        box, [((0, 2), (0, 6)), ((2, 4), (0, 3)), ((2, 3), (3, 6))]
    )  # [3:4, 3:6] unread
    assert _covers(box, [((0, 1), (0, 6)), ((1, 2), (0, 6)), ((2, 3), (0, 6)), ((3, 4), (0, 6))])
    assert not _covers(box, [])
    assert _covers((), [()])  # a 0-d tensor read


def tracked_whole(t: torch.Tensor, handed: Handed) -> WholeTensor:
    from tpload.integrations.handoff import whole_tensor

    handed.taken = True
    return whole_tensor(t, handed)


def test_a_whole_tensor_serves_every_op_and_counts_any_but_metadata_as_a_read() -> None:
    for read in (
        lambda t, p: p.copy_(t),
        lambda t, p: p.fill_(t[0].item()),
        lambda t, p: p.__setitem__(0, t[0]),
        lambda t, p: t.to(torch.float64),
        lambda t, p: t.data,
    ):
        handed = Handed("norm", ((0, 4),), whole=True)
        t = tracked_whole(torch.arange(4.0), handed)
        t.shape, t.dtype, t.size(0), t.numel(), t.dim(), repr(t)  # noqa: B018 (metadata: no read)
        assert not handed.reads
        param = torch.zeros(4)
        out = read(t, param)
        assert handed.consumed
        assert type(out) in (
            torch.Tensor,
            type(None),
        )  # results are plain: tracking does not spread
    handed = Handed("norm", ((0, 4),), whole=True)
    handed.taken = True
    assert handed.what() == "taken, never read"


def test_cuts_become_element_ranges(llama: Path) -> None:
    planner = planner_of(read_native(llama)[0], load_config("llama"))
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
                box = box_of(c, item.fit.weight)
                state[c.name] = full[c.name][tuple(slice(lo, hi) for lo, hi in box)].clone()
        handed = dict(windows(state, plan.items, rank=rank))
        assert set(handed) == set(full)
        for name, t in handed.items():
            got = vllm_like(name, t, rank, tp, kv_heads=2)
            want = vllm_like(name, full[name], rank, tp, kv_heads=2)
            assert type(got) in (torch.Tensor, WholeTensor) and torch.equal(got, want), (name, rank)
            assert (
                got.data_ptr() != state[name].data_ptr()
            )  # a private copy: loaders may write into it


def test_engine_skips_the_mtp_layers_only() -> None:
    assert engine_skips({"num_hidden_layers": 61, "num_nextn_predict_layers": 1}) == (
        "model.layers.61.*",
    )
    assert engine_skips({"num_hidden_layers": 2, "num_nextn_predict_layers": 2}) == (
        "model.layers.2.*",
        "model.layers.3.*",
    )
    assert engine_skips({"num_hidden_layers": 32, "tie_word_embeddings": True}) == ()


def test_declared_skips_follow_the_models_config() -> None:
    """What vLLM's Llama/DeepSeek load_weights skip: MTP layers (never read), a tied lm_head and
    rotary tables (handed over, their consumption not required)."""
    skips = {
        s.glob: s
        for s in declared_skips(
            {"num_hidden_layers": 2, "num_nextn_predict_layers": 1, "tie_word_embeddings": True}
        )
    }
    assert set(skips) == {
        "model.layers.2.*",
        "lm_head.*",
        "*.rotary_emb.inv_freq",
        "*.rotary_emb.cos_cached",
        "*.rotary_emb.sin_cached",
    }
    assert (
        not skips["model.layers.2.*"].read
        and "MTP layer 2 (num_hidden_layers is 2)" in skips["model.layers.2.*"].reason
    )
    assert skips["lm_head.*"].read and "tie_word_embeddings" in skips["lm_head.*"].reason
    assert skips["*.rotary_emb.inv_freq"].matches("model.layers.0.self_attn.rotary_emb.inv_freq")
    untied = {
        s.glob for s in declared_skips({"num_hidden_layers": 2, "tie_word_embeddings": False})
    }
    assert "lm_head.*" not in untied and not any(g.startswith("model.layers") for g in untied)


def test_a_handoff_names_every_tensor_left_unread_and_excuses_declared_skips(llama: Path) -> None:
    full = whole(llama)
    plan = planner_of(read_native(llama)[0], load_config("llama")).plan(Layout(2), "packed", 1)
    state = {
        c.name: full[c.name][tuple(slice(lo, hi) for lo, hi in box_of(c, item.fit.weight))].clone()
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

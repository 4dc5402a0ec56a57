"""The consumption check on quantized checkpoints, where vLLM gives no set of expected parameters
(its CPU build cannot start FP8/FP4 models here, so in-process): a stand-in for vLLM's quantized
``load_weights`` takes tpload's real windows of a block-FP8 DeepSeek-V3 (F8_E4M3 weights, F32
``weight_scale_inv`` 128x128 block scales) and of an NVFP4 one (U8 packed FP4 weights, F8_E4M3
``weight_scale`` 16-element group scales, F32 scalar ``weight_scale_2`` / ``input_scale``) and
narrows them as vLLM's layers do:

* FusedMoE.weight_loader: ``_load_w13`` (gate/up: dimension 0, shard = param rows / 2) and
  ``_load_w2`` (down: dimension 1) for weights and block/group scales; per-tensor scales by
  ``param_data[expert_id][idx] = loaded_weight`` (ModelOpt), ``input_scale`` through
  ``.to(device)``;
* linear parameters (vllm/model_executor/parameter.py): ``load_merged_column_weight`` /
  ``load_column_parallel_weight`` narrow the output dimension, ``load_row_parallel_weight`` the
  input one (packed FP4 columns and block scales by the parameter's own, already divided, sizes),
  and ``PerTensorScaleParameter`` copies scalars whole; replicated layers and norms copy whole.

It must get exactly the bytes the same loader gets from the whole tensors, leave nothing unread,
and a stand-in that forgets one tensor (a scale, the way a name vLLM does not map is dropped) must
fail naming it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import torch

from tpload.integrations.handoff import Handoff, element_ranges, unconsumed_message
from tpload.integrations.skips import declared_skips
from tpload.loading.pick import choose, model_config
from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.selection.config import with_rules
from tpload.storage.catalogue import read_native
from tpload.tools.published import write_published

from ...ckpt_tools import whole

TP = 2
COLUMN = re.compile(
    r"(q_b_proj|kv_b_proj|gate_proj|up_proj|embed_tokens|lm_head)\."
)  # vLLM's column parallel
ROW = re.compile(r"(o_proj|down_proj)\.")  # row parallel (the rest is replicated)
EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.")
SHARD = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


@pytest.fixture(scope="module", params=["deepseek-v3-tiny", "nvfp4-tiny"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("quantized") / request.param, request.param)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def stand_in(
    shapes: dict[str, tuple[int, ...]],
    rank: int,
    params: dict[str, torch.Tensor],
    *,
    forget: str = "",
) -> Callable[[Iterable[tuple[str, torch.Tensor]]], None]:
    """vLLM's quantized load_weights, reduced to what it does with each loaded tensor (module
    docstring). ``shapes``: the stored shapes, as vLLM knows its layers' sizes from the config;
    ``params`` receives the parameters it fills."""

    def param(key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return params.setdefault(key, torch.zeros(shape, dtype=dtype))

    def per_rank(stem: str, leaf: str, dim: int) -> int:
        """The parameter's size along the sharded dimension, as vLLM builds it from the layer's
        sizes."""
        weight = shapes[f"{stem}.weight"]
        if leaf == "weight_scale_inv":  # block FP8: one scale per 128 of the rank's rows / columns
            return cdiv(weight[dim] // TP, 128)
        if leaf == "weight_scale" and dim == 1:  # NVFP4: one scale per 16 of the rank's unpacked K
            return (2 * weight[1] // TP) // 16
        return weight[dim] // TP  # weights (packed FP4: K / 2 already) and NVFP4 row scales

    experts = 1 + max(int(m.group(1)) for n in shapes if (m := EXPERT.search(n)))

    def load_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            if name == forget:
                continue
            stem, leaf = name.rsplit(".", 1)
            expert = EXPERT.search(name)
            if t.dim() == 0:  # per-tensor scales (FP4 weight_scale_2, input_scale)
                if expert:  # FusedMoE._load_per_tensor_weight_scale / _load_single_value
                    shard = SHARD[expert.group(2)]
                    key = f"{stem.rsplit('.', 3)[0]}.{'w2' if shard == 'w2' else 'w13'}_{leaf}"
                    p = param(key, (experts, 2), t.dtype)
                    if leaf == "input_scale":
                        p[int(expert.group(1))] = t.to(p.device)
                    elif shard == "w2":
                        p[int(expert.group(1))] = t
                    else:
                        p[int(expert.group(1))][0 if shard == "w1" else 1] = t
                else:  # PerTensorScaleParameter: scalars copied whole
                    param(name, (1,), t.dtype).copy_(t)
                continue
            if expert:  # FusedMoE.weight_loader: _load_w13 / _load_w2
                shard = SHARD[expert.group(2)]
                dim = 1 if shard == "w2" else 0
                size = per_rank(stem, leaf, dim)
                other = t.shape[1 - dim]
                shape = (2 * size, other) if dim == 0 else (other, size)
                data = param(
                    f"{stem.replace(expert.group(2), 'w2' if dim else 'w13')}.{leaf}",
                    shape,
                    t.dtype,
                )
                loaded = t.narrow(dim, size * rank, size)
                if dim == 0:
                    data = data.narrow(0, 0 if shard == "w1" else size, size)
                data.copy_(loaded)
            elif COLUMN.search(name):  # load_column_parallel_weight / load_merged_column_weight
                size = per_rank(stem, leaf, 0)
                part = t.narrow(0, rank * size, size)
                param(name, tuple(part.shape), t.dtype).copy_(part)
            elif ROW.search(
                name
            ):  # load_row_parallel_weight: the parameter's input size, packed or blocked
                size = per_rank(stem, leaf, 1)
                part = t.narrow(1, rank * size, size)
                param(name, tuple(part.shape), t.dtype).copy_(part)
            else:  # ReplicatedLinear, norms, the router, biases: copied whole
                p = param(name, tuple(t.shape), t.dtype)
                assert p.size() == t.size()
                p.copy_(t)

    return load_weights


def handed_over(root: Path, rank: int) -> tuple[Handoff, dict[str, torch.Tensor], tuple]:
    """tpload's hand-off of ``rank``'s real windows (the plan the engine's load uses: MTP layers
    skipped)."""
    full = whole(root)
    skips = declared_skips(model_config(root))
    config = with_rules(choose("auto", root)[0], skip=tuple(s.glob for s in skips if not s.read))
    plan = planner_of(read_native(root)[0], config).plan(Layout(TP), "packed", rank)
    state = {}
    for item in plan.items:
        metas = {
            m.name: m for m in (item.fit.weight, item.fit.scale, item.fit.scale2) if m is not None
        }
        for c in item.cuts:
            state[c.name] = full[c.name][
                tuple(slice(lo, hi) for lo, hi in element_ranges(c, metas[c.name]))
            ].clone()
    return Handoff(state, plan.items, rank=rank), full, skips


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("rank", range(TP))
def test_a_quantized_loader_consumes_every_window_and_gets_the_whole_tensors_bytes(
    checkpoint: Path, rank: int
) -> None:
    handoff, full, skips = handed_over(checkpoint, rank)
    dtypes = {t.dtype for t in full.values()}
    assert {
        torch.float8_e4m3fn,
        torch.float32,
    } <= dtypes  # FP8 weights or FP4 group scales, F32 scales
    assert (torch.uint8 in dtypes) == (checkpoint.name == "nvfp4-tiny")  # packed FP4
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    ours, want = {}, {}
    stand_in(shapes, rank, ours)(handoff.tensors())
    layers = model_config(checkpoint)["num_hidden_layers"]
    stand_in(shapes, rank, want)(
        (n, t) for n, t in sorted(full.items()) if not n.startswith(f"model.layers.{layers}.")
    )  # vLLM's own: MTP skipped
    assert set(ours) == set(want) and len(ours) > 50
    for key in want:
        assert torch.equal(raw(ours[key]), raw(want[key])), key
    unread, excused = handoff.unconsumed(skips)
    assert unread == [] and excused == {}
    assert sum(not h.whole for h in handoff.handed.values()) > 50  # windows, not only whole tensors


@pytest.mark.parametrize(
    "forget",
    [
        r"experts\.3\.down_proj\.weight_scale(_inv)?$",
        r"experts\.1\.up_proj\.weight$",
        r"layers\.0\.mlp\.gate_proj\.weight_scale(_inv)?$",
    ],
)
def test_a_quantized_loader_that_forgets_a_tensor_fails_naming_it(
    checkpoint: Path, forget: str
) -> None:
    handoff, full, skips = handed_over(checkpoint, 1)
    name = next(n for n in handoff.handed if re.search(forget, n))
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    stand_in(shapes, 1, {}, forget=name)(handoff.tensors())
    unread, _ = handoff.unconsumed(skips)
    assert [h.name for h in unread] == [name]
    assert unconsumed_message(unread, "vllm").startswith(
        f"1 tensor(s) tpload handed over were not consumed by vllm's weight loaders: {name} "
        "(taken, never read"
    )

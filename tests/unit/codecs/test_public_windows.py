"""Channel windows as the published checkpoints need them: :func:`tpload.codecs.channel_window`
and the codecs' :meth:`Codec.window` / :func:`cut_axis` built on it.

* vLLM's uneven gpt-oss rule (I = 2880 in 32-channel steps: tp 4, 8 cut, tp 16 refused);
* attention heads as units (q heads split, kv heads shared by tp / kv_heads ranks, refusals,
  and ``share_units = false`` refused by the planner);
* even splits of FP8 128-blocks (refusals naming the numbers, scale windows = weight / 128 with
  a ceiling on the ragged edge, whole when replicated);
* expert-parallel cuts of stacked ``[E, rows, ...]`` tensors taking experts ``share(E, ep, g)``.

Every cut is checked against a plain numpy slice of the whole tensor's bytes.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tpload.codecs.base import Cut, channel_window, cut_axis
from tpload.codecs.fp4_e8m0 import FP4
from tpload.codecs.fp8_block import FP8
from tpload.codecs.plain import PLAIN
from tpload.model.meta import TensorMeta
from tpload.planning.layout import Layout, share
from tpload.planning.planner import Planner
from tpload.selection.config import Config, Rule, load_config
from tpload.storage.catalogue import Catalogue

from .test_windows import fit_of, meta

ITEM = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def stored(m: TensorMeta, seed: int = 0) -> np.ndarray:
    """Random bytes shaped ``m.shape`` plus a trailing byte axis (one element = ITEM bytes)."""
    raw = np.random.default_rng(seed).integers(0, 256, m.nbytes, dtype=np.uint8)
    return raw.reshape(m.shape + (ITEM[m.dtype],))


def box(whole: np.ndarray, cut: Cut) -> np.ndarray:
    """The cut's box of the tensor's bytes seen as ``cut.view`` (flattened)."""
    view = np.ascontiguousarray(whole).reshape(-1).reshape(cut.view)
    return view[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]].reshape(-1)


def assert_cut(cut: Cut, m: TensorMeta, whole: np.ndarray, want: np.ndarray) -> None:
    """The cut names ``m``, has the element shape of ``want`` (a numpy slice of ``whole``) and its
    bytes."""
    assert (cut.name, cut.dtype, cut.shape) == (m.name, m.dtype, want.shape[:-1])
    assert cut.nbytes == want.size
    np.testing.assert_array_equal(box(whole, cut), np.ascontiguousarray(want).reshape(-1))


def spans(n: int, tp: int, **kw: object) -> list[tuple[int, int] | str]:
    return [channel_window(n, tp, r, **kw) for r in range(tp)]


# -- vLLM's uneven gpt-oss rule


@pytest.mark.parametrize(
    "tp, sizes", [(2, [1440, 1440]), (4, [736, 736, 736, 672]), (8, [384] * 7 + [192])]
)
def test_gpt_oss_uneven_shares_of_2880(tp: int, sizes: list[int]) -> None:
    got = spans(2880, tp, atom=32, align=32, uneven=True)
    assert [hi - lo for lo, hi in got] == sizes
    assert got[0][0] == 0 and got[-1][1] == 2880
    assert all(a[1] == b[0] for a, b in pairwise(got))  # contiguous, no gap, no overlap
    assert all(lo % 32 == 0 for lo, _ in got)


def test_gpt_oss_uneven_tp16_leaves_the_last_rank_nothing_and_is_refused() -> None:
    # ceil(2880/32) = 90 steps; ceil(90/16) = 6 steps = 192 per rank; 15 x 192 = 2880: rank 15 gets
    # nothing
    for r in (0, 15):
        why = channel_window(2880, 16, r, atom=32, align=32, uneven=True)
        assert isinstance(why, str)
        assert (
            "2880" in why
            and "192" in why
            and "rank 15" in why
            and "tp 16" in why
            and "nothing" in why
        )


def test_gpt_oss_stacked_down_proj_window_follows_the_uneven_rule() -> None:
    # down_proj_blocks [E, H, I/32, 16] split cols (I) with align 32, as gpt-oss.toml says
    e, h = 2, 8
    w, s = (
        meta("down_proj_blocks", "U8", (e, h, 90, 16)),
        meta("down_proj_scales", "U8", (e, h, 90)),
    )
    fit = fit_of(FP4, w, s, stacked=True)
    pw, ps = stored(w, 1), stored(s, 2)
    for r, (lo, hi) in enumerate([(0, 736), (736, 1472), (1472, 2208), (2208, 2880)]):
        cuts = FP4.window(fit, "cols", 4, r, align=32, uneven=True)
        assert not isinstance(cuts, str), cuts
        wc, sc = cuts
        assert_cut(wc, w, pw, pw[:, :, lo // 32 : hi // 32])
        assert_cut(sc, s, ps, ps[:, :, lo // 32 : hi // 32])
        assert FP4.decoded_shape(fit, wc) == (e, h, hi - lo)
    assert isinstance(FP4.window(fit, "cols", 16, 0, align=32, uneven=True), str)


def test_gpt_oss_stacked_gate_up_rows_take_twice_the_share() -> None:
    # gate_up_proj_blocks [E, 2I, H/32, 16] split rows with align 64: shares of 2 x 736 rows
    w, s = (
        meta("gate_up_proj_blocks", "U8", (2, 5760, 1, 16)),
        meta("gate_up_proj_scales", "U8", (2, 5760, 1)),
    )
    fit = fit_of(FP4, w, s, stacked=True)
    pw, ps = stored(w, 3), stored(s, 4)
    edges = [0, 1472, 2944, 4416, 5760]
    for r in range(4):
        wc, sc = FP4.window(fit, "rows", 4, r, align=64, uneven=True)
        lo, hi = edges[r], edges[r + 1]
        assert_cut(wc, w, pw, pw[:, lo:hi])
        assert_cut(sc, s, ps, ps[:, lo:hi])


# -- heads as units


def test_query_heads_are_split_whole() -> None:
    # 8 heads of 32 at tp 4: two heads (64 rows) per rank
    assert spans(256, 4, units=8) == [(0, 64), (64, 128), (128, 192), (192, 256)]
    q = meta("q_proj.weight", "BF16", (256, 16))
    whole = stored(q, 5)
    fit = fit_of(PLAIN, q, split="rows")
    for r in range(4):
        wc, sc = PLAIN.window(fit, "rows", 4, r, units=8)
        assert sc is None
        assert_cut(wc, q, whole, whole[64 * r : 64 * (r + 1)])


@pytest.mark.parametrize("tp, kv_heads", [(4, 2), (8, 2), (8, 4), (4, 1)])
def test_kv_heads_are_shared_by_consecutive_ranks(tp: int, kv_heads: int) -> None:
    # vLLM: rank r takes kv head r // (tp // kv_heads)
    size = 32
    k = meta("k_proj.weight", "BF16", (kv_heads * size, 8))
    whole = stored(k, tp)
    fit = fit_of(PLAIN, k, split="rows")
    for r in range(tp):
        head = r // (tp // kv_heads)
        assert channel_window(kv_heads * size, tp, r, units=kv_heads) == (
            head * size,
            (head + 1) * size,
        )
        wc, _ = PLAIN.window(fit, "rows", tp, r, units=kv_heads)
        assert_cut(wc, k, whole, whole[head * size : (head + 1) * size])


def test_two_kv_heads_at_tp4_rank_by_rank() -> None:
    assert spans(256, 4, units=2) == [(0, 128), (0, 128), (128, 256), (128, 256)]


@pytest.mark.parametrize(
    "n, tp, units, words",
    [
        (96, 2, 3, "3 heads / tp 2 is not whole"),
        (96, 4, 3, "tp 4 is neither a divisor nor a multiple of the 3 heads"),
        (100, 2, 8, "100 channels are not 8 equal heads"),
        (
            6 * 64,
            2,
            6,
            "6 heads of 64 channels: a window of 192 channels does not start and end on whole "
            "128-channel",
        ),
    ],
)
def test_heads_that_cannot_be_cut_are_refused(n: int, tp: int, units: int, words: str) -> None:
    atom = 128 if "128" in words else 1
    why = channel_window(n, tp, 0, units=units, atom=atom)
    assert isinstance(why, str) and words in why


def test_fp8_heads_must_start_on_whole_blocks() -> None:
    # an FP8 k_proj of 4 heads of 64 rows: tp 2 takes 128 rows (one block), tp 4 half a block
    w, s = (
        meta("k_proj.weight", "F8_E4M3", (256, 256)),
        meta("k_proj.weight_scale_inv", "F32", (2, 2)),
    )
    fit = fit_of(FP8, w, s)
    wc, sc = FP8.window(fit, "rows", 2, 1, units=4)
    assert (wc.rows, sc.rows) == ((128, 256), (1, 2))
    why = FP8.window(fit, "rows", 4, 1, units=4)
    assert isinstance(why, str) and "4 heads of 64 channels" in why and "128-channel blocks" in why


def _heads_planner(share_units: bool) -> Planner:
    rule = Rule(
        match="*.k_proj.weight",
        role="plain",
        split="rows",
        units="num_key_value_heads",
        share_units=share_units,
        index=1,
    )
    config = Config("test-heads", (rule,))
    k = meta("model.layers.0.self_attn.k_proj.weight", "BF16", (2 * 32, 16))
    catalogue = Catalogue(Path("/nonexistent"), {k.name: k}, None)
    return Planner(catalogue, config, model={"num_key_value_heads": 2})


def test_unit_sharing_is_allowed_by_default_and_refused_when_the_rule_says_so() -> None:
    shared = _heads_planner(True)
    assert shared.layout_problems(Layout(4)) == []
    plan = shared.plan(Layout(4), "packed", 3)
    assert plan.items[0].weight.rows == (32, 64)  # rank 3: kv head 1
    refused = _heads_planner(False)
    problems = refused.layout_problems(Layout(4))
    assert (
        len(problems) == 1
        and "2 units / tp 4" in problems[0]
        and "not shared between ranks" in problems[0]
    )
    assert refused.layout_problems(Layout(2)) == []


# -- FP8 128-blocks, even split


def fp8_pair(n: int, k: int, scale_dtype: str = "F32") -> tuple[TensorMeta, TensorMeta]:
    return meta("w.weight", "F8_E4M3", (n, k)), meta(
        "w.weight_scale_inv", scale_dtype, (-(-n // 128), -(-k // 128))
    )


@pytest.mark.parametrize("split", ["rows", "cols"])
def test_fp8_window_that_is_not_whole_blocks_is_refused_naming_the_numbers(split: str) -> None:
    # 1536 channels at tp 8 = 192 each: not whole 128-blocks (12 blocks for 8 ranks)
    w, s = fp8_pair(1536, 1536)
    fit = fit_of(FP8, w, s)
    why = FP8.window(fit, split, 8, 0)
    assert why == "12 scale blocks of 128 / tp 8 is not whole"
    # with a rule's align the message states the share itself
    why = FP8.window(fit, split, 8, 0, align=128)
    assert why == "1536 channels / tp 8 = 192, not a multiple of 128"
    assert not isinstance(FP8.window(fit, split, 4, 3), str)  # 384 = 3 blocks: fine


@pytest.mark.parametrize("split", ["rows", "cols"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_fp8_scale_window_is_the_weight_window_over_128(split: str, tp: int) -> None:
    n = 2048
    w, s = fp8_pair(n, n)
    fit = fit_of(FP8, w, s)
    pw, ps = stored(w, tp), stored(s, tp + 1)
    per = n // tp
    for r in range(tp):
        wc, sc = FP8.window(fit, split, tp, r)
        lo, hi = r * per, (r + 1) * per
        sl, ss = (slice(lo, hi), slice(None)), (slice(lo // 128, hi // 128), slice(None))
        if split == "cols":
            sl, ss = sl[::-1], ss[::-1]
        assert_cut(wc, w, pw, pw[sl])
        assert_cut(sc, s, ps, ps[ss])


def test_fp8_576_rows_have_5_scale_rows_whole_when_replicated() -> None:
    w, s = fp8_pair(576, 7168)  # kv_a_proj_with_mqa: the last block is half a block
    assert s.shape == (5, 56)
    fit = fit_of(FP8, w, s)
    pw, ps = stored(w, 7), stored(s, 8)
    wc, sc = FP8.window(fit, "replicate", 8, 5)
    assert_cut(wc, w, pw, pw)
    assert_cut(sc, s, ps, ps)
    # tp 5 splits the 5 blocks: the last rank's window is the short block, its scale row the ceiling
    wc, sc = FP8.window(fit, "rows", 5, 4)
    assert_cut(wc, w, pw, pw[512:576])
    assert_cut(sc, s, ps, ps[4:5])
    assert FP8.scale_rows(fit, 512, 576) == (4, 5)


def test_fp8_ragged_cols_scale_window_takes_the_ceiling() -> None:
    w, s = fp8_pair(256, 1000)  # 8 column blocks, the last of 104
    fit = fit_of(FP8, w, s)
    pw, ps = stored(w, 9), stored(s, 10)
    wc, sc = FP8.window(fit, "cols", 2, 1)
    assert_cut(wc, w, pw, pw[:, 512:1000])
    assert_cut(sc, s, ps, ps[:, 4:8])


# -- stacked experts, expert-parallel


@pytest.mark.parametrize("n, parts", [(4, 2), (5, 2), (8, 3), (128, 5)])
def test_share_is_equal_parts_with_the_remainder_last(n: int, parts: int) -> None:
    got = [share(n, parts, g) for g in range(parts)]
    per = n // parts
    assert got[:-1] == [(g * per, (g + 1) * per) for g in range(parts - 1)]
    assert got[-1] == ((parts - 1) * per, n)


@pytest.mark.parametrize("ep", [1, 2, 3])
def test_ep_cut_of_stacked_blocks_picks_the_shared_experts(ep: int) -> None:
    e = 5
    w, s = (
        meta("gate_up_proj_blocks", "U8", (e, 128, 2, 16)),
        meta("gate_up_proj_scales", "U8", (e, 128, 2)),
    )
    d, ds = (
        meta("down_proj_blocks", "U8", (e, 64, 4, 16)),
        meta("down_proj_scales", "U8", (e, 64, 4)),
    )
    pw, ps, pd, pds = stored(w, 11), stored(s, 12), stored(d, 13), stored(ds, 14)
    up, down = fit_of(FP4, w, s, stacked=True), fit_of(FP4, d, ds, stacked=True)
    for g in range(ep):
        e0, e1 = experts = share(e, ep, g)
        for r in range(2):  # tp 2 inside each group
            wc, sc = FP4.window(up, "rows", 2, r, align=32, experts=experts)
            assert_cut(wc, w, pw, pw[e0:e1, 64 * r : 64 * (r + 1)])
            assert_cut(sc, s, ps, ps[e0:e1, 64 * r : 64 * (r + 1)])
            wc, sc = FP4.window(down, "cols", 2, r, align=32, experts=experts)
            assert wc.group == 64  # 64 view rows of each expert make its rows
            assert_cut(wc, d, pd, pd[e0:e1, :, 2 * r : 2 * (r + 1)])
            assert_cut(sc, ds, pds, pds[e0:e1, :, 2 * r : 2 * (r + 1)])
        wc, sc = FP4.window(up, "replicate", 2, 0, experts=experts)
        assert_cut(wc, w, pw, pw[e0:e1])
        assert_cut(sc, s, ps, ps[e0:e1])


def test_cut_axis_of_a_stacked_1d_tensor_takes_one_value_per_expert() -> None:
    m = meta("down_proj_bias_scalar", "F32", (6,))
    whole = stored(m, 15)
    cut = cut_axis(m, None, experts=share(6, 4, 3))
    assert_cut(cut, m, whole, whole[3:6])


def test_planner_gives_each_ep_group_its_share_of_stacked_experts() -> None:
    # gpt-oss's own config on an in-memory catalogue: 5 experts at tp 2 x ep 2 -> experts [0, 2),
    # [2, 5)
    e, h, i = 5, 64, 128
    up_w = meta("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", (e, 2 * i, h // 32, 16))
    up_s = meta("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", (e, 2 * i, h // 32))
    down_w = meta("model.layers.0.mlp.experts.down_proj_blocks", "U8", (e, h, i // 32, 16))
    down_s = meta("model.layers.0.mlp.experts.down_proj_scales", "U8", (e, h, i // 32))
    tensors = (up_w, up_s, down_w, down_s)
    data = {t.name: stored(t, n) for n, t in enumerate(tensors)}
    catalogue = Catalogue(Path("/nonexistent"), {t.name: t for t in tensors}, None)
    planner = Planner(
        catalogue,
        load_config("gpt-oss"),
        model={"num_attention_heads": 8, "num_key_value_heads": 2},
    )
    layout = Layout(2, 2)
    assert planner.layout_problems(layout) == []
    for rank in range(layout.world):
        g, r = layout.position(rank)
        e0, e1 = share(e, 2, g)
        items = {it.name: it for it in planner.plan(layout, "packed", rank).items}
        up, down = items[up_w.name], items[down_w.name]
        # gate_up: rows of 2I = 256 in uneven 64-steps (128 each); down: cols of I = 128 (64 each)
        assert_cut(
            up.weight, up_w, data[up_w.name], data[up_w.name][e0:e1, 128 * r : 128 * (r + 1)]
        )
        assert_cut(up.scale, up_s, data[up_s.name], data[up_s.name][e0:e1, 128 * r : 128 * (r + 1)])
        assert_cut(
            down.weight, down_w, data[down_w.name], data[down_w.name][e0:e1, :, 2 * r : 2 * (r + 1)]
        )
        assert_cut(
            down.scale, down_s, data[down_s.name], data[down_s.name][e0:e1, :, 2 * r : 2 * (r + 1)]
        )

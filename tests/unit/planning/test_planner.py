"""Windows against a plain slice of the whole decoded tensor, and layout errors."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tpload.loading.planner import planner_of
from tpload.model.errors import ConfigError, LayoutError
from tpload.planning.layout import Layout
from tpload.planning.planner import Planner
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.tools.synth import SynthSpec, write_checkpoint

from ...reference import expert_window, fp4, fp8, read_all


def planner_for(root: Path, config: object = None) -> Planner:
    return planner_of(read_native(root)[0], config or load_config())


@pytest.fixture(scope="module")
def planner(small_ckpt: Path) -> Planner:
    return planner_for(small_ckpt)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_windows_are_slices_of_the_whole_decode(
    planner: Planner, small_ckpt: Path, tp: int
) -> None:
    raw = read_all(small_ckpt)
    for r in range(tp):
        plan = planner.plan(Layout(tp), "expanded", r)
        assert {i.name for i in plan.items} == {n for n in raw if not n.endswith(".scale")}
        for item in plan.items:
            if item.role == "plain":
                continue
            w = raw[item.name][slice(*item.weight.rows), slice(*item.weight.cols)]
            s = raw[item.scale.name][slice(*item.scale.rows), slice(*item.scale.cols)]
            base = item.name[: -len(".weight")]
            if item.role == "fp4":
                whole, got = fp4(raw[item.name], raw[base + ".scale"]), fp4(w, s)
            else:
                whole, got = fp8(raw[item.name], raw[base + ".scale"], 32), fp8(w, s, 32)
            np.testing.assert_array_equal(
                got, expert_window(item.name, whole, tp, r), err_msg=item.name
            )
            assert item.outputs[0].shape == got.shape


def test_head_is_vocabulary_parallel(planner: Planner) -> None:
    items = [
        next(i for i in planner.plan(Layout(4), "packed", r).items if i.name == "head.weight")
        for r in range(4)
    ]
    assert [i.weight.rows for i in items] == [(0, 128), (128, 256), (256, 384), (384, 512)]


def test_slots_do_not_overlap_and_are_aligned(planner: Planner) -> None:
    plan = planner.plan(Layout(2), "packed", 1)
    spans = sorted((o.offset, o.offset + o.nbytes) for i in plan.items for o in i.outputs)
    assert all(a[1] <= b[0] for a, b in pairwise(spans))
    assert all(o % 256 == 0 for o, _ in spans)
    assert plan.arena_bytes >= spans[-1][1]


def test_impossible_tp_says_what_would_work(tmp_path: Path) -> None:
    root = write_checkpoint(
        tmp_path, SynthSpec(inter=192, hidden=256, experts=4)
    )  # 192/2 = 96 channels
    p = planner_for(root)
    assert p.working_tps(4) == [1]
    with pytest.raises(LayoutError) as e:
        p.check_layout(Layout(2), 2)
    msg = str(e.value)
    assert "192 channels / tp 2 = 96, not a multiple of 64" in msg
    assert "tp values that cut this checkpoint: 1;" in msg and "--tp 1 --ep 2" in msg


def test_tp8_on_the_reference_channels_suggests_tp4_ep2(tmp_path: Path) -> None:
    # The reference model's I = 2304: tp 8 gives 288 channels, not a multiple of 64.
    root = write_checkpoint(tmp_path, SynthSpec(hidden=256, inter=2304, experts=2, vocab=64))
    p = planner_for(root)
    with pytest.raises(LayoutError) as e:
        p.check_layout(Layout(8), 8)
    msg = str(e.value)
    assert "2304 channels / tp 8 = 288, not a multiple of 64" in msg
    assert "tp values that cut this checkpoint: 1, 2, 4" in msg and "--tp 4 --ep 2" in msg
    p.check_layout(Layout(4, 2), 8)  # the suggestion really works


def test_the_way_on_comes_first_before_the_tensors_that_fail(planner: Planner) -> None:
    # tp 3 fails on many tensors: the first line says which tp values cut the checkpoint, the list
    # (capped on a terminal) comes after it
    with pytest.raises(LayoutError) as e:
        planner.check_layout(Layout(3), 3)
    first, *rest = str(e.value).splitlines()
    assert first == (
        "cannot load with tp 3 x ep 1 on 3 ranks: tp values that cut this checkpoint: 1, 2; for 3 "
        "ranks use --tp 1 --ep 3"
    )
    assert rest and all(line.startswith(("  - ", "    ")) for line in rest), rest


def test_one_rank_asked_for_tp_2_is_told_to_launch_2_ranks_first(planner: Planner) -> None:
    with pytest.raises(LayoutError) as e:
        planner.check_layout(Layout(2), 1)
    assert str(e.value).splitlines()[0] == (
        "cannot load with tp 2 x ep 1 on 1 rank: launch 2 ranks for it (torchrun "
        "--nproc-per-node 2), or tp values that cut this checkpoint: 1, 2; for 1 rank use --tp 1 "
        "--ep 1"
    )


def test_world_mismatch(planner: Planner) -> None:
    with pytest.raises(LayoutError, match=r"tp 2 x ep 1 = 2 ranks, but the group has 4"):
        planner.check_layout(Layout(2), 4)


def test_expert_parallel_groups_split_experts_last_takes_remainder(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path, SynthSpec(experts=7))
    p = planner_for(root)
    held = []
    for g in range(2):
        plan = p.plan(Layout(2, 2), "packed", g * 2)
        held.append(
            sorted({int(i.name.split(".")[4]) for i in plan.items if ".experts." in i.name})
        )
    assert held == [[0, 1, 2], [3, 4, 5, 6]]


def test_absurd_tp_is_refused_at_once() -> None:
    with pytest.raises(LayoutError, match="product at most 65536"):
        Layout(100_000_000)


def test_a_large_tp_that_cannot_cut_is_refused_quickly_with_suggestions(planner: Planner) -> None:
    t0 = time.perf_counter()
    with pytest.raises(LayoutError) as e:
        planner.check_layout(Layout(60_000), 60_000)
    assert (
        time.perf_counter() - t0 < 10
    )  # the suggestion search is bounded (64 tp values), not 60,000
    assert "tp values that cut this checkpoint: 1, 2, 4" in str(e.value)


def test_replicated_experts_by_config_land_on_every_ep_group(
    small_ckpt: Path, tmp_path: Path
) -> None:
    from ...ckpt_tools import config_with

    config = config_with(
        tmp_path,
        """
[[rules]]
match = "mtp.*.ffn.experts.*.w[13].weight"
role = "fp4"
split = "rows"
experts = false

[[rules]]
match = "mtp.*.ffn.experts.*.w2.weight"
role = "fp4"
split = "cols"
experts = false
""",
    )
    p = planner_for(small_ckpt, load_config(config))
    plans = [p.plan(Layout(2, 2), "packed", r) for r in range(4)]
    experts = [
        {int(i.name.split(".")[4]) for i in plan.items if ".experts." in i.name} for plan in plans
    ]
    assert experts == [set(range(8))] * 4  # every rank holds every expert...
    w1 = [
        next(i for i in plan.items if i.name == "mtp.0.ffn.experts.0.w1.weight").weight.rows
        for plan in plans
    ]
    assert w1 == [(0, 128), (128, 256), (0, 128), (128, 256)]  # ...still cut by tp


def test_deferred_experts_are_located_only_by_their_group(small_ckpt: Path) -> None:
    from tpload.selection.config import with_rules

    p = planner_for(small_ckpt, with_rules(load_config(), defer=("mtp.0.ffn.experts.*",)))
    held = [
        sorted({int(n.split(".")[4]) for n in p.plan(Layout(1, 2), "packed", g).deferred})
        for g in range(2)
    ]
    assert held == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_unmatched_tensors_of_a_real_layout_are_listed_grouped(tmp_path: Path) -> None:
    """A config for one layout pointed at another: thousands of names would be unreadable, so the
    error groups them by shape with numbers as N, each with its count."""
    from tpload.tools.published import write_published

    root = write_published(tmp_path / "v3", "deepseek-v3-tiny")
    config = tmp_path / "only-attention.toml"
    config.write_text('[[rules]]\nmatch = "*.self_attn.*"\nrole = "auto"\n')
    with pytest.raises(ConfigError) as e:
        planner_for(root, load_config(config))
    msg = str(e.value)
    assert "match no rule" in msg
    assert (
        "model.layers.N.mlp.experts.N.gate_proj.weight (16)" in msg
    )  # layer 1 and the MTP layer, 8 experts each
    assert "(and 19 more)" in msg  # twelve classes shown, the rest counted


def test_planning_leaves_the_collector_as_it_found_it(small_ckpt: Path) -> None:
    """A library call has no collector policy: the collector stays on, nothing is frozen."""
    import gc

    frozen = gc.get_freeze_count()
    planner = planner_for(small_ckpt)
    plans = [planner.plan(Layout(2), "packed", r) for r in range(2)]
    assert plans[1].items and gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_plan_is_held_as_columns(planner: Planner) -> None:
    plan = planner.plan(Layout(2), "packed", 1)
    assert plan.index.dtype.kind == "i" and plan.offsets.dtype.kind == "i"
    assert len(plan.index) == len(plan.klass) == len(plan.offsets) == len(plan.items)
    assert [o.offset for i in plan.items for o in i.outputs[:1]] == plan.offsets.tolist()
    # entries cut alike share one class, and so one object of cuts
    assert len(plan.table) < len(plan.items)
    assert {id(s) for s in plan.shapes} == {id(s) for s in plan.table.values()}


def test_part_of_is_the_inverse_of_share() -> None:
    from tpload.planning.layout import part_of, share

    for n in range(0, 40):
        for parts in range(1, 10):
            for k in range(parts):
                lo, hi = share(n, parts, k)
                assert all(part_of(i, n, parts) == k for i in range(lo, hi)), (n, parts, k)


def test_the_planner_reads_no_file_and_says_when_config_json_is_needed(small_ckpt: Path) -> None:
    """planning/ opens nothing: config.json comes in as ``model=``."""
    import ast

    import tpload.planning
    import tpload.planning.planner

    sources = [
        Path(tpload.planning.planner.__file__),
        *Path(tpload.planning.__file__).parent.glob("*.py"),
    ]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("pick", "storage", "pathlib", "gc"), path
                assert not (node.module or "").startswith("storage.") or node.module == (
                    "storage.catalogue"
                ), path
            assert not (isinstance(node, ast.Name) and node.id == "open"), path
    catalogue = read_native(small_ckpt)[0]
    with pytest.raises(ConfigError, match="counts heads by its field 'num_attention_heads', but"):
        Planner(catalogue, load_config("llama"))


def test_a_kind_is_a_named_mode(planner: Planner) -> None:
    from tpload.model.modes import Kind

    assert planner.plan(Layout(1), "expanded", 0).kind is Kind.EXPANDED
    with pytest.raises(ConfigError, match="kind 'unpacked' is not one of packed, expanded"):
        planner.plan(Layout(1), "unpacked", 0)


@pytest.mark.parametrize("kind", ["packed", "expanded"])
def test_a_plan_s_outputs_as_columns_are_its_items_outputs(planner: Planner, kind: str) -> None:
    """RankPlan.outputs names, places and shapes each served tensor as item_of does, without making
    the items; and item(t) is items[t]."""
    for rank in range(2):
        plan = planner.plan(Layout(2), kind, rank)
        want = [o for item in plan.items for o in item.outputs]
        outs = plan.outputs
        assert list(outs) == want == [outs[k] for k in range(len(outs))]
        assert len(outs) == len(want) and outs.names == [o.name for o in want]
        assert outs.dtypes == [o.dtype for o in want] and outs.shapes == [o.shape for o in want]
        assert [plan.item(t) for t in range(len(plan.items))] == list(plan.items)
        assert plan.names == [item.name for item in plan.items]


def test_a_plan_s_cut_names_are_its_items_cuts(planner: Planner) -> None:
    for kind in ("packed", "expanded"):
        plan = planner.plan(Layout(2), kind, 1)
        assert plan.cut_names() == [c.name for item in plan.items for c in item.cuts]


def test_a_plan_s_views_are_its_items_cuts_views(planner: Planner) -> None:
    for kind in ("packed", "expanded"):
        plan = planner.plan(Layout(2), kind, 0)
        want = {c.name: c.view for item in plan.items for c in item.cuts}
        assert list(plan.views().items()) == list(want.items())

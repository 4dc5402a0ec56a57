"""Small whole tensors loaded in batches (batch.py): the same fingerprints, digests, bytes and
sha256 verdicts as the per-tensor path, one read and one pass for many."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import tpload
from tpload.codecs.base import whole
from tpload.kernels import compiled as kernels
from tpload.kernels.fingerprint import host_fingerprint, word_width
from tpload.loading.batch import NO_FLAGS, NO_LANES
from tpload.model.errors import LoadError
from tpload.planning import batches as batch
from tpload.storage.base import StorageBase
from tpload.tools.published import write_published

from ...helpers import tensor_offset
from .batch_runs import runs as item_runs


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("many") / "m", "many-tensors", tensors=600)


@pytest.mark.parametrize("seed", range(4))
def test_the_kernel_gives_each_window_the_per_tensor_fingerprint(seed: int) -> None:
    """Whole tensors and windows of them (rows and byte columns, at odd starts: words are read at
    any alignment), each copied row after row into its slot with the fingerprint HostFingerprint
    gives."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    shapes = [(int(rng.integers(1, 9)), int(rng.integers(1, 70))) for _ in range(40)]
    off, at, boxes = [], 3, []
    for r, c in shapes:
        off.append(at)
        at += r * c + int(rng.integers(0, 5))  # gaps, and odd starts
        r0, c0 = int(rng.integers(0, r)), int(rng.integers(0, c))
        whole = rng.random() < 0.3
        boxes.append(
            ((0, r), (0, c))
            if whole
            else ((r0, int(rng.integers(r0 + 1, r + 1))), (c0, int(rng.integers(c0 + 1, c + 1))))
        )
    dst = np.zeros(
        len(shapes) * 600, dtype=np.uint8
    )  # slots of 600 bytes (the largest tensor is 8 x 69)
    dst_off = np.array([k * 600 for k in range(len(shapes))], dtype=np.int64)
    out = np.zeros((len(shapes), 3), dtype=np.int64)
    start = np.array(
        [a + r0 * c + c0 for a, (_, c), ((r0, _), (c0, _)) in zip(off, shapes, boxes, strict=True)],
        dtype=np.int64,
    )
    rows = np.array([r1 - r0 for (r0, r1), _ in boxes], dtype=np.int64)
    width = np.array([c1 - c0 for _, (c0, c1) in boxes], dtype=np.int64)
    kernels.gather_windows(
        src,
        start,
        rows,
        np.array([c for _, c in shapes], dtype=np.int64),
        width,
        np.array([word_width(int(w)) for w in width], dtype=np.int64),
        dst,
        dst_off,
        out,
        NO_LANES,
        NO_FLAGS,
    )
    for k, (r, c) in enumerate(shapes):
        (r0, r1), (c0, c1) = boxes[k]
        window = src[off[k] : off[k] + r * c].reshape(r, c)[r0:r1, c0:c1].copy()
        assert tuple(out[k]) == host_fingerprint(window)
        assert np.array_equal(dst[dst_off[k] : dst_off[k] + window.size], window.reshape(-1))


def test_a_batched_load_serves_what_the_per_tensor_path_serves(
    many: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched = tpload.load(many, progress=False, verify="rank")
    got = {n: t.clone() for n, t in batched.state_dict().items()}
    digest, hashed = batched.report.mine.digest, batched.report.mine.hashed
    batched.release()
    monkeypatch.setattr(batch, "SMALL_BYTES", 0)  # every tensor on its own
    single = tpload.load(many, progress=False, verify="rank")
    assert single.report.mine.digest == digest and single.report.mine.hashed == hashed == 600
    assert all(single.state_dict()[n].equal(t) for n, t in got.items())
    single.release()


def test_a_changed_small_tensor_fails_the_batched_load_naming_it(
    many: Path, tmp_path: Path
) -> None:
    import shutil

    root = Path(shutil.copytree(many, tmp_path / "m"))
    name = "model.layers.3.extra.7.weight"
    path, offset, nbytes = tensor_offset(root, name)
    with open(path, "r+b") as f:  # the manifest left as it was
        f.seek(offset + nbytes - 1)
        b = f.read(1)
        f.seek(offset + nbytes - 1)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(LoadError, match=f"{name}.*sha256"):
        tpload.load(root, progress=False)


@pytest.fixture(scope="module")
def dealt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """many's 600 tensors dealt to two files in turn: natural order alternates between them."""
    return write_published(
        tmp_path_factory.mktemp("dealt") / "d", "many-tensors-alternating", tensors=600
    )


def _batches(root: Path) -> tuple[list[tuple[int, int, bool]], int, set[Path]]:
    """The runs PlanRuns makes of ``root``'s plan at tp 1 (llama), the item-wise rule's run count,
    and the files."""
    from tpload.loading.planner import planner_of
    from tpload.planning.layout import Layout
    from tpload.selection.config import load_config
    from tpload.storage.sharded import ShardedStorage

    storage = ShardedStorage(root)
    try:
        plan = planner_of(storage.catalogue, load_config("llama")).plan(Layout(1), "packed", 0)
        items = plan.items
        old = item_runs(items, "packed", storage)
        runs = batch.PlanRuns(plan, "packed", storage)
        for i, j, _ in runs:  # never across files
            assert len({storage.stored(items[k].name).path for k in runs.order[i:j]}) == 1
        assert sorted(runs.order.tolist()) == list(range(len(items)))  # each entry once
        return runs.runs, len(old), {storage.stored(n).path for n in plan.names}
    finally:
        storage.close()


def test_batches_stop_at_a_file_a_gap_or_a_tensor_they_cannot_take(many: Path) -> None:
    runs, old, files = _batches(many)
    assert len(runs) == old == len(files) == 4  # one batch a file: 600 tiny tensors in order
    assert all(b for _, _, b in runs) and runs[-1][1] == 600


def test_tensors_alternating_between_files_batch_as_if_stored_file_by_file(
    many: Path, dealt: Path
) -> None:
    """A plan whose natural order alternates between two files at every tensor: batches by where
    the tensors lie, one a file, as few as a file-by-file layout of the same tensors makes (not
    one a tensor: 600)."""
    runs, old, files = _batches(dealt)
    assert len(files) == 2 and len(runs) == old == 2
    assert len(runs) <= len(_batches(many)[0])
    assert all(b for _, _, b in runs) and sum(j - i for i, j, _ in runs) == 600


def test_an_alternating_layout_serves_what_the_file_by_file_one_serves(
    many: Path, dealt: Path
) -> None:
    """The same tensors stored file by file and dealt to two files in turn: the same bytes and the
    same digest (batches read in storage order, served and digested in natural order)."""
    got = []
    for root in (many, dealt):
        shards = tpload.load(root, progress=False, verify="rank")
        got.append(
            (shards.report.mine.digest, {n: t.clone() for n, t in shards.state_dict().items()})
        )
        shards.release()
    (a, mine), (b, theirs) = got
    assert a == b and mine.keys() == theirs.keys()
    assert all(mine[n].equal(t) for n, t in theirs.items())


def test_the_loop_asks_whether_its_sink_takes_batches_once_not_once_a_batch(
    many: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink's kind (a runtime-checkable Protocol: an isinstance that walks its attributes) is
    asked once a load, however many batches it has (here 600: one a tensor)."""
    from tpload.model.progress import BatchSink

    meta = type(BatchSink)
    real = meta.__instancecheck__
    asked = []

    def check(cls: type, obj: object) -> bool:
        if cls is BatchSink:
            asked.append(obj)
        return real(cls, obj)

    monkeypatch.setattr(batch, "BATCH_BYTES", 128)  # one 8x8 BF16 tensor: a batch each
    monkeypatch.setattr(meta, "__instancecheck__", check)
    shards = tpload.load(many, progress=False, verify="off")
    try:
        assert shards.report.mine.tensors == 600
    finally:
        shards.release()
    assert 1 <= len(asked) <= 2


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("v3") / "v3", "deepseek-v3-tiny")


def test_packed_weights_with_their_scales_batch_alike(
    fp8: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole small FP8 weights and their scales (DeepSeek-V3's q_a/kv_a projections, replicated) go
    in batches too: the same digest and bytes as one by one."""
    from tpload.loading.planner import planner_of
    from tpload.planning.layout import Layout
    from tpload.selection.config import load_config
    from tpload.storage.sharded import ShardedStorage

    storage = ShardedStorage(fp8)
    try:
        planner = planner_of(storage.catalogue, load_config("deepseek-v3"))
        plan = planner.plan(Layout(2), "packed", 0)
        batched = [
            plan.items[k]
            for ks, _ in item_runs(plan.items, "packed", storage)
            if len(ks) > 1
            for k in ks
        ]
    finally:
        storage.close()
    assert any(item.codec.scaled for item in batched)  # the case under test really batches
    with_batches = tpload.load(fp8, tp=1, progress=False, verify="rank")
    got, digest = (
        {n: t.clone() for n, t in with_batches.state_dict().items()},
        with_batches.report.mine.digest,
    )
    with_batches.release()
    monkeypatch.setattr(batch, "SMALL_BYTES", 0)
    alone = tpload.load(fp8, tp=1, progress=False, verify="rank")
    assert alone.report.mine.digest == digest
    assert all(alone.state_dict()[n].equal(t) for n, t in got.items())
    alone.release()


def test_a_nan_code_in_a_batched_fp8_weight_is_refused_naming_it(fp8: Path, tmp_path: Path) -> None:
    import shutil

    from ...helpers import poke

    root = Path(shutil.copytree(fp8, tmp_path / "v3"))
    name = (
        "model.layers.0.self_attn.q_a_proj.weight"  # 128 x 256 FP8: small and whole on every rank
    )
    poke(root, name, 5, 0x7F, fix_manifest=True)  # E4M3 NaN, with a manifest that vouches for it
    with pytest.raises(LoadError, match=f"(?s){name}.*NaN"):
        tpload.load(root, tp=1, progress=False)


@pytest.mark.parametrize("between", [False, True])
def test_counting_over_many_windows_is_numpys(between: bool) -> None:
    """count_windows over windows at odd starts and strides: numpy's count of the same bytes."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 1 << 14, dtype=np.uint8)
    src[rng.integers(0, src.size, 500)] = 0x7F  # plenty of hits
    starts, rows, strides, widths, want = [], [], [], [], 0
    for _ in range(30):
        stride = int(rng.integers(1, 90))
        r, w = int(rng.integers(1, 9)), int(rng.integers(1, stride + 1))
        a = int(rng.integers(0, src.size - r * stride))
        window = src[a : a + r * stride].reshape(r, stride)[:, :w]
        want += int(
            ((window >= 0x70) & (window <= 0x80)).sum()
            if between
            else ((window == 0x7F) | (window == 0xFF)).sum()
        )
        starts.append(a), rows.append(r), strides.append(stride), widths.append(w)
    arrays = [np.array(x, dtype=np.int64) for x in (starts, rows, strides, widths)]
    got = kernels.count_windows(
        src, *arrays, 0x70 if between else 0x7F, 0x80 if between else 0xFF, between
    )
    assert got == want


class _Windows:
    """numpy windows standing in for a batch's, for Codec.clean."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self.arrays = arrays

    def count_either(self, a: int, b: int) -> int:
        return sum(int(((x == a) | (x == b)).sum()) for x in self.arrays)

    def count_between(self, lo: int, hi: int) -> int:
        return sum(int(((x >= lo) & (x <= hi)).sum()) for x in self.arrays)

    def gathered(self) -> np.ndarray:
        return np.concatenate([x.reshape(-1) for x in self.arrays])


def _value_scales(values: list, dtype: str) -> np.ndarray:
    """Scale values as the stored bytes of ``dtype`` (a 2 x 2 scale)."""
    f32 = np.array(values, "<f4").reshape(2, 2)
    if dtype == "BF16":
        return (f32.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    return f32.astype("<f2" if dtype == "F16" else "<f4").view(np.uint8)


@pytest.mark.parametrize("scale_dtype", ["F32", "BF16", "F16", "F8_E8M0"])
def test_fp8_clean_says_clean_only_when_no_item_check_could_find_anything(scale_dtype: str) -> None:
    """FP8 batches skip the item checks only when nothing is there to find: a NaN code, a bad scale,
    a scale that could overflow bf16 (what triggers the overflow check) each make it say no."""
    from tpload.codecs import fp8_block
    from tpload.codecs.base import Fit
    from tpload.model.meta import TensorMeta

    fit = Fit(
        TensorMeta("w", "f", "F8_E4M3", (256, 256)),
        TensorMeta("s", "f", scale_dtype, (2, 2)),
        (128, 128),
    )
    codec = fp8_block.FP8Block()
    weights = np.full((256, 256), 0x38, dtype=np.uint8)  # 1.0 in E4M3
    if scale_dtype != "F8_E8M0":  # values (F16 cannot hold a scale large enough to overflow)
        good = _value_scales([2.0**-7] * 4, scale_dtype)
        big = [2.0**120] if scale_dtype != "F16" else []
        bad = [
            _value_scales([v, 1.0, 1.0, 1.0], scale_dtype)
            for v in [0.0, np.inf, np.nan, -1.0, *big]
        ]
    else:
        good = np.full((2, 2), 120, dtype=np.uint8)
        bad = [
            np.array([[0, 120], [120, 120]], np.uint8),
            np.array([[0xFF, 120], [120, 120]], np.uint8),
            np.array([[250, 120], [120, 120]], np.uint8),
        ]
    assert codec.clean(fit, _Windows(good, good), _Windows(weights, weights))
    for b in bad:
        assert not codec.clean(fit, _Windows(good, b), _Windows(weights, weights))
    nan = weights.copy()
    nan[7, 9] = 0x7F
    assert not codec.clean(fit, _Windows(good, good), _Windows(weights, nan))
    # and the item checks find something in each (a large scale: with the largest code, 448)
    for b in bad:
        checker = codec.checker(fit, whole(fit.weight), whole(fit.scale))
        checker.scale(b.reshape(2, -1), 0)
        checker.weight(np.full((256, 256), 0x7E, dtype=np.uint8), 0)
        assert any(n for n, _, _ in checker.problems()), b


def test_a_bad_scale_in_a_batched_fp8_item_is_refused_naming_it(fp8: Path, tmp_path: Path) -> None:
    import shutil

    from ...helpers import poke

    root = Path(shutil.copytree(fp8, tmp_path / "v3"))
    name = "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv"  # a small expert's F32 scale
    poke(
        root, name, 3, 0xFF, fix_manifest=True
    )  # the sign and exponent of its first value: NaN, with a manifest that vouches
    with pytest.raises(LoadError, match=f"(?s){name}.*not finite and positive"):
        tpload.load(root, tp=1, progress=False)


class _BoxOnly(StorageBase):
    """A storage that says where windows lie only one ``box`` at a time (a rank file's way: no
    columns, the base's ``spans``)."""

    def __init__(self, storage: object) -> None:
        self.storage = storage

    def box(self, *args: object) -> object:
        return self.storage.box(*args)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["packed", "expanded"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_plan_s_runs_as_columns_are_the_item_wise_runs(
    many: Path, fp8: Path, kind: str, tp: int
) -> None:
    """PlanRuns groups the plan's entries as runs() groups its items, with each batch's pieces
    (stored tensor, span, box, cut box, slot) the same, from the table's columns or from ``box``."""
    from tpload.loading.pick import choose
    from tpload.loading.planner import planner_of
    from tpload.planning.layout import Layout
    from tpload.storage.sharded import ShardedStorage

    for root in (many, fp8):
        storage = ShardedStorage(root)
        try:
            plan = planner_of(storage.catalogue, choose("auto", root)[0]).plan(
                Layout(tp), kind, tp - 1
            )
            items = plan.items
            old = item_runs(items, kind, storage, classes=plan.shapes)
            new = batch.PlanRuns(plan, kind, storage)
            by_box = batch.PlanRuns(plan, kind, _BoxOnly(storage))
            assert new.runs == by_box.runs
            assert new.order.tolist() == by_box.order.tolist()
            assert [(new.order[i:j].tolist(), b) for i, j, b in new.runs] == [
                (ks, bool(p)) for ks, p in old
            ]
            assert any(b for _, _, b in new.runs)
            for (i, j, _), (ks, pieces) in zip(new.runs, old, strict=True):
                if not pieces:
                    continue
                p, q = new.pieces(i, j)
                flat = [piece for per_item in pieces for piece in per_item]
                cuts = [c for k in ks for c in items[k].cuts]
                assert new.names[p:q] == [s.name for s, _, _ in flat] == [c.name for c in cuts]
                assert new.cut_boxes[p:q] == [c.box for c in cuts]
                assert new.out[p:q].tolist() == [
                    items[k].output(c.name).offset for k in ks for c in items[k].cuts
                ]
                for spans in (new.spans, by_box.spans):
                    assert [
                        (o, r, w, (b[0], b[1]), (b[2], b[3]))
                        for o, r, w, b in zip(
                            spans.offset[p:q].tolist(),
                            spans.rows[p:q].tolist(),
                            spans.row_bytes[p:q].tolist(),
                            spans.box[p:q].tolist(),
                            strict=True,
                        )
                    ] == [(s.offset, s.rows, s.row_bytes, rows, cols) for s, rows, cols in flat]
        finally:
            storage.close()


def test_a_batch_s_stored_tensors_are_the_source_s_boxes(fp8: Path) -> None:
    """What a batch hands the hasher for each piece is what the source's ``box`` says, whether
    made from the batch's columns (a source that says each name's sha256 at once) or asked of the
    source one by one."""
    from tpload.loading.batch import Batch
    from tpload.loading.pick import choose
    from tpload.loading.planner import planner_of
    from tpload.planning.layout import Layout
    from tpload.sources.storage import StorageSource
    from tpload.storage.sharded import ShardedStorage

    class OneByOne(StorageSource):
        def promised(self, names: Sequence[str]) -> None:
            return None  # no columns: each piece's stored bytes asked of the source

    storage = ShardedStorage(fp8)
    try:
        plan = planner_of(storage.catalogue, choose("auto", fp8)[0]).plan(Layout(2), "packed", 1)
        buffer = np.empty(batch.BATCH_BYTES, np.uint8)
        for source in (StorageSource(storage), OneByOne(storage)):
            runs = batch.PlanRuns(plan, "packed", source)
            for i, j, batched in runs:
                if not batched:
                    continue
                p, q = runs.pieces(i, j)
                b = Batch(source, runs, p, q, "a batch", buffer)
                cuts = [c for t in runs.order[i:j].tolist() for c in plan.item(t).cuts]
                want = [source.box(c.name, c.view, c.rows, c.cols)[0] for c in cuts]
                assert b.stored(list(range(q - p))) == want
    finally:
        storage.close()

"""The trainer's side of the plan: the loader's planner cuts each engine rank's windows from a
version's tensor table exactly as an export of a checkpoint of those weights does, and the loader's
loop over the trainer's tensors in memory gives each rank the digest a load of that checkpoint
gives, also when the items are split between trainer ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tpload.attest.predict import predict
from tpload.loading.loop import run
from tpload.model.meta import ITEMSIZE
from tpload.model.progress import Silent
from tpload.planning.layout import Layout
from tpload.refresh.layout import EngineLayout
from tpload.refresh.tensors import Cutting, TensorStorage, config_for, entry_of, owned_plan
from tpload.refresh.terms import RefreshError
from tpload.selection.config import load_config
from tpload.sources.hashing import Hasher
from tpload.sources.storage import StorageSource
from tpload.tools.export import export
from tpload.tools.published import write_published
from tpload.transfer.cpu import CpuTransfer
from tpload.verification.digest import digest
from tpload.verification.node import HashPlan

from ...ckpt_tools import whole

TP = 2


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("plans") / "llama", "llama-tiny", seed=3)


def _cutting(root: Path) -> tuple[Cutting, dict[str, torch.Tensor]]:
    config = load_config("llama")
    model = json.loads((root / "config.json").read_text())
    layout = EngineLayout(config.id(), TP, 1, "packed", TP, config="llama", model=model)
    tensors = whole(root)
    return Cutting([entry_of(n, t) for n, t in tensors.items()], layout, config), tensors


def test_each_engine_rank_gets_the_windows_an_export_cuts_in_its_order(
    llama: Path, tmp_path: Path
) -> None:
    cutting, _ = _cutting(llama)
    export(llama, tmp_path / "tp2", Layout(TP), load_config("llama"))
    doc = json.loads((tmp_path / "tp2" / "NATIVE_MANIFEST.json").read_text())
    for rank in range(TP):
        exported = doc["ranks"][rank]["tensors"]
        windows = cutting.windows(rank)
        assert [n for n, _, _ in windows] == list(exported)  # names and order
        for name, view, ((r0, r1), (c0, c1)) in windows:
            e = exported[name]
            nbytes = ITEMSIZE[e["dtype"]] * int(torch.tensor(e["shape"]).prod())
            assert (r1 - r0) * (c1 - c0) == nbytes, name
            assert 0 <= r0 < r1 <= view[0] and 0 <= c0 < c1 <= view[1], name
    split = [w for w in cutting.windows(1) if w[2] != ((0, w[1][0]), (0, w[1][1]))]
    assert split, "tp 2 splits some tensor (else the windows prove nothing)"


def _lines(cutting: Cutting, tensors: dict, rank: int, names: frozenset[str]) -> list:
    storage = TensorStorage(cutting.catalogue, {n: t for n, t in tensors.items() if n in names})
    result = run(
        StorageSource(storage),
        owned_plan(cutting.plan(rank), names),
        transfer=CpuTransfer(torch.device("cpu")),
        hasher=Hasher(HashPlan(rank, frozenset())),
        samples=0,
        progress=Silent(),
    )
    return [(o.name, o.dtype, o.shape, result.fingerprints[o.name]) for o in result.outputs]


def test_the_trainers_digests_are_a_loads_even_split_between_trainer_ranks(llama: Path) -> None:
    cutting, tensors = _cutting(llama)
    predicted = predict(llama, load_config("llama"), Layout(TP), "packed")
    names = sorted(tensors)
    halves = (frozenset(names[::2]), frozenset(names[1::2]))
    for rank in range(TP):
        whole_rank = digest(_lines(cutting, tensors, rank, frozenset(names)))
        split = digest([x for h in halves for x in _lines(cutting, tensors, rank, h)])
        assert whole_rank == split == predicted[rank]
    assert predicted[0] != predicted[1]


def test_a_trainer_rank_reading_a_tensor_it_does_not_hold_is_refused_by_name(llama: Path) -> None:
    cutting, _ = _cutting(llama)
    with pytest.raises(
        RefreshError, match=r"tensor model\.norm\.weight: this trainer rank does not"
    ):
        _lines(cutting, {}, 0, frozenset(["model.norm.weight"]))


def test_the_config_must_be_the_engines_by_id() -> None:
    llama = load_config("llama")
    layout = EngineLayout(llama.id(), 1, 1, "packed", 1, config="llama")
    assert config_for(layout).id() == llama.id()
    with pytest.raises(RefreshError, match="both sides must plan with the same rules"):
        config_for(EngineLayout("0" * 12, 1, 1, "packed", 1, config="llama"))
    with pytest.raises(RefreshError, match="cannot be read here"):
        config_for(EngineLayout("0" * 12, 1, 1, "packed", 1, config="no-such-config"))


def test_the_senders_digests_are_predicts_by_the_window_and_by_the_loop(
    llama: Path, tmp_path: Path
) -> None:
    """The sender takes a tensor served as stored by its window's fingerprint, and runs the loop
    for the rest (an F16 tensor is served converted to BF16): both give predict's digests."""
    from safetensors.torch import save_file

    from tpload.cli import main
    from tpload.refresh.trainer import RefreshSender, as_stored

    tensors = whole(llama)
    for name in ("model.norm.weight", "model.layers.0.mlp.down_proj.weight"):
        tensors[name] = tensors[name].to(torch.float16)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    save_file(tensors, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    (mixed / "config.json").write_bytes((llama / "config.json").read_bytes())
    assert main(["manifest", str(mixed)]) == 0
    cutting, tensors = _cutting(mixed)
    plan = cutting.plan(1)
    stored = {i.name for i in plan.items if as_stored(i, plan.kind)}
    assert "model.layers.0.mlp.down_proj.weight" not in stored and len(stored) > 10
    sender = RefreshSender(rank=0, trainer_ranks=1)
    part, windows = sender._cut(
        cutting, TensorStorage(cutting.catalogue, tensors), frozenset(tensors)
    )
    predicted = predict(mixed, load_config("llama"), Layout(TP), "packed")
    for rank in range(TP):
        lines = [
            (n, getattr(torch, d), tuple(s), tuple(fp)) for n, d, s, fp in part[str(rank)]["served"]
        ]
        assert digest(lines, ranks=cutting.catalogue.ranks()) == predicted[rank]
        assert sum(w.size for w in windows[rank]) == sum(
            (r1 - r0) * (c1 - c0) for _, _, ((r0, r1), (c0, c1)) in cutting.windows(rank)
        )


def test_the_served_table_is_read_from_the_checkpoint_and_a_skipped_tensor_may_be_left_out(
    llama: Path,
) -> None:
    from tpload.refresh.manifest import TensorEntry
    from tpload.refresh.tensors import natural, table_of
    from tpload.verification.pushed import table_problems as _table_problems

    table = table_of(llama)
    assert table == {
        n: (e.dtype, e.shape) for n, e in ((n, entry_of(n, t)) for n, t in whole(llama).items())
    }
    served = natural(TensorEntry(n, d, s) for n, (d, s) in table.items())
    left_out = tuple(t for t in served if t.name != "model.norm.weight")
    assert _table_problems(served, left_out, frozenset({"model.norm.weight"})) == []
    (line,) = _table_problems(served, left_out)
    assert line.endswith("missing model.norm.weight")
    other = tuple(
        TensorEntry(t.name, "F32", t.shape) if t.name == "lm_head.weight" else t for t in served
    )
    (line,) = _table_problems(served, other)
    assert "lm_head.weight is F32 [512, 128], served as BF16 [512, 128]" in line

"""Weight-prefix detection (tpload/prefix.py): the four shapes, MTP, ambiguity, and a load under a
prefix serving the stored names with the plain checkpoint's bytes and per-tensor digests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tpload
from tpload.config import load_config
from tpload.errors import ConfigError
from tpload.pick import planner_of
from tpload.plan import Layout
from tpload.prefix import detect
from tpload.storage import open_storage
from tpload.tools.published import write_published

from ..ckpt_tools import renamed

BODY = [
    "layers.0.self_attn.q_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.1.self_attn.q_proj.weight",
    "embed_tokens.weight",
    "norm.weight",
]


def names(prefix: str, *, head: str = "lm_head.weight") -> list[str]:
    return [prefix + n for n in BODY] + [head]


@pytest.mark.parametrize(
    "prefix, head",
    [
        ("model.", "lm_head.weight"),
        ("language_model.model.", "language_model.lm_head.weight"),
        ("model.language_model.", "lm_head.weight"),
        ("", "lm_head.weight"),
    ],
)
def test_the_four_prefixes_are_found_and_rewritten_to_the_configs(prefix: str, head: str) -> None:
    found = detect(names(prefix, head=head), wanted="model.")
    assert found.found == prefix and found.layers == 2
    assert [found.rewrite(n) for n in names(prefix, head=head)] == names("model.")
    assert found.rewrites == (prefix != "model.")
    assert repr(prefix) in found.describe()


def test_mtp_under_mtp_or_as_extra_layers_is_said() -> None:
    assert (
        "MTP under 'mtp.'"
        in detect(names("model.") + ["mtp.0.eh_proj.weight"], wanted="model.").mtp
    )
    extra = detect(
        names("model.") + ["model.layers.2.eh_proj.weight"],
        wanted="model.",
        model={"num_hidden_layers": 2},
    )
    assert extra.mtp == "MTP as extra layers 2..2 (num_hidden_layers 2)"
    assert (
        detect(["mtp.0.x"], wanted="model.").mtp
        and detect(["mtp.0.x"], wanted="model.").found is None
    )


def test_two_prefixes_for_one_weight_are_refused_naming_both() -> None:
    with pytest.raises(
        ConfigError,
        match=r"ambiguous weight prefix: layers under both 'model\.' and "
        r"'language_model\.model\.' \(model\.layers\.0\..* and "
        r"language_model\.model\.layers\.0\..* are one weight",
    ):
        detect(
            names("model.") + ["language_model.model.layers.0.mlp.down_proj.weight"],
            wanted="model.",
            where="/ckpt",
        )


def test_a_vision_towers_layers_are_not_a_prefix() -> None:
    got = detect(
        names("language_model.model.") + ["vision_tower.encoder.layers.0.mlp.fc1.weight"],
        wanted="model.",
    )
    assert got.found == "language_model.model."
    assert (
        got.rewrite("vision_tower.encoder.layers.0.mlp.fc1.weight")
        == "vision_tower.encoder.layers.0.mlp.fc1.weight"
    )


def test_configs_say_or_show_their_prefix() -> None:
    assert load_config("llama").rules_prefix == "model."
    assert load_config("deepseek-v4").rules_prefix == ""
    assert load_config("deepseek-v4-mtp").rules_prefix is None  # prefix-blind: nothing rewritten


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("prefix")
    plain = write_published(base / "plain", "llama-tiny")
    wrapped = renamed(plain, base / "wrapped", lambda n: "language_model." + n)
    return plain, wrapped


def test_a_wrapped_checkpoint_plans_as_the_plain_one(llama: tuple[Path, Path]) -> None:
    plain, wrapped = llama
    plans = []
    for root in (plain, wrapped):
        storage = open_storage(root, tp=2, ep=1, rank=0, world=2)
        try:
            planner = planner_of(storage.catalogue, load_config("llama"))
        finally:
            storage.close()
        plans.append(planner.plan(Layout(2), "packed", 1))
    assert [(i.name, i.rule, i.weight[1:]) for i in plans[1].items] == [
        ("language_model." + i.name, i.rule, i.weight[1:]) for i in plans[0].items
    ]


def test_a_load_under_a_prefix_serves_the_stored_names_and_the_same_bytes(
    llama: tuple[Path, Path],
) -> None:
    plain, wrapped = llama
    a = tpload.load(plain, progress=False, device="cpu")
    b = tpload.load(wrapped, progress=False, device="cpu")
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sb) == sorted("language_model." + n for n in sa)
    assert all(torch.equal(sa[n], sb["language_model." + n]) for n in sa)
    ma = json.loads((plain / "NATIVE_MANIFEST.json").read_text())["tensors"]
    mb = json.loads((wrapped / "NATIVE_MANIFEST.json").read_text())["tensors"]
    assert {n: e["sha256"] for n, e in ma.items()} == {
        n[len("language_model.") :]: e["sha256"] for n, e in mb.items()
    }
    assert a.report.weight_prefix == "model." and b.report.weight_prefix == "language_model.model."
    assert any(
        "weight prefix 'language_model.model.'" in n and "rewritten" in n for n in b.report.notes
    )
    a.release(), b.release()

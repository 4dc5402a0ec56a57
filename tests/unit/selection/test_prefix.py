"""Weight-prefix detection (tpload/selection/prefix.py): the four shapes, MTP, ambiguity, and a load
under a prefix serving the stored names with the plain checkpoint's bytes and per-tensor digests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import tpload
from tpload.loading.planner import planner_of
from tpload.model.errors import ConfigError, LoadError
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.selection.prefix import detect
from tpload.storage.open import open_storage
from tpload.tools.published import write_published

from ...ckpt_tools import renamed

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


@pytest.mark.parametrize(
    "prefix, head, twin, other",
    [
        ("language_model.model.", "language_model.lm_head.weight", "embed_tokens.weight", "model."),
        ("language_model.model.", "language_model.lm_head.weight", "lm_head.weight", ""),
        ("model.language_model.", "lm_head.weight", "norm.weight", "model."),
        ("model.", "lm_head.weight", "norm.weight", "language_model.model."),
        ("", "lm_head.weight", "embed_tokens.weight", "model."),
    ],
)
def test_a_tensor_outside_the_layers_under_two_prefixes_is_refused_naming_both(
    prefix: str, head: str, twin: str, other: str
) -> None:
    """``model.embed_tokens.weight`` beside ``language_model.model.embed_tokens.weight``: two
    models, or one weight stored twice; which one the config's rule serves is a guess."""
    stored = names(prefix, head=head)
    mine = next(n for n in stored if n.endswith(twin))
    said = lambda p: repr(p) if p else "no prefix"  # noqa: E731
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"/ckpt: ambiguous weight prefix: tensors under both {said(prefix)} (the layers') and "
            f"{said(other)} ({mine} and {other + twin} are one weight); keep one model per folder"
        ),
    ):
        detect([*stored, other + twin], wanted="model.", where="/ckpt")


@pytest.mark.parametrize(
    "stored",
    [
        # Llava, Gemma-3, Llama-4 as transformers wrote them before 4.52: the tower beside
        names("language_model.model.", head="language_model.lm_head.weight")
        + [
            "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight",
            "vision_tower.vision_model.embeddings.patch_embedding.weight",
            "multi_modal_projector.linear_1.weight",
            "vision_model.model.norm.weight",
        ],
        # the same classes since: everything under model., the language model one level down
        names("model.language_model.")
        + [
            "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
            "model.vision_tower.vision_model.post_layernorm.weight",
            "model.multi_modal_projector.linear_1.weight",
            "model.visual.blocks.0.attn.qkv.weight",
        ],
        # Qwen2-VL: the tower beside model.
        names("model.") + ["visual.blocks.0.attn.qkv.weight", "visual.merger.mlp.0.weight"],
    ],
)
def test_multimodal_checkpoints_load_with_no_note(stored: list[str]) -> None:
    got = detect(stored, wanted="model.", where="/ckpt")
    assert got.layers == 2 and got.elsewhere == "" and "outside the layers" not in got.describe()


def test_a_lone_tensor_under_another_prefix_is_noted() -> None:
    stored = [
        n
        for n in names("language_model.model.", head="language_model.lm_head.weight")
        if not n.endswith("embed_tokens.weight")
    ] + ["model.embed_tokens.weight"]
    got = detect(stored, wanted="model.")
    assert got.found == "language_model.model." and got.rewrite("model.embed_tokens.weight") == (
        "model.embed_tokens.weight"
    )
    assert (
        "; 1 tensor(s) outside the layers under 'model.' instead (first "
        "model.embed_tokens.weight): matched and served as stored" in got.describe()
    )


def test_a_load_refuses_the_twin_and_notes_the_lone_one(
    llama: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wrapped = llama
    embed = "language_model.model.embed_tokens.weight"
    twin = renamed(
        wrapped,
        tmp_path / "twin",
        lambda n: n,
        extra={"model.embed_tokens.weight": torch.zeros(2, 2)},
    )
    with pytest.raises(
        LoadError,
        match=re.escape(
            f"tensors under both 'language_model.model.' (the layers') and 'model.' ({embed} and "
            "model.embed_tokens.weight are one weight)"
        ),
    ):
        tpload.load(twin, progress=False, device="cpu")
    lone = renamed(
        wrapped, tmp_path / "lone", lambda n: n, extra={"model.extra_norm.weight": torch.ones(4)}
    )
    shards = tpload.load(lone, progress=False, device="cpu")
    assert "model.extra_norm.weight" in shards.state_dict()
    assert any(
        n.startswith("weight prefix 'language_model.model.'")
        and "1 tensor(s) outside the layers under 'model.' instead (first model.extra_norm.weight)"
        in n
        for n in shards.report.notes
    )
    shards.release()


@pytest.mark.parametrize(
    "stored",
    [
        names("model."),
        names("") + ["model.norm.weight"],
        names("language_model.model.", head="language_model.lm_head.weight")
        + ["model.visual.layers.0.w", "vision_tower.encoder.layers.0.w"],
        names("model.language_model.") + ["model.layers.0.mlp.down_proj.weight"],
        names("model.") + ["mtp.layers.3.w", "model.layers.007.x", "model.layers.x.layers.3.y"],
        ["model.layers.3a.x", "a0layers.1.x", "model.layers.5", "foo"],
        ["mtp.x"],
        [],
    ],
)
def test_the_templates_find_what_the_names_do(stored: list[str]) -> None:
    # the planner reads the prefix off the table's templates: the same prefix, notes and refusals
    from tpload.model.table import templates

    def found(**kw: object) -> object:
        try:
            return detect(stored, wanted="model.", model={"num_hidden_layers": 1}, **kw)
        except ConfigError as e:
            return str(e)

    assert found(templates=templates(stored)) == found()

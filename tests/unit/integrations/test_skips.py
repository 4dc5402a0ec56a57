"""The tensors an engine's loaders skip on purpose, from the model's config."""

from __future__ import annotations

from tpload.integrations.skips import declared_skips, engine_skips


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

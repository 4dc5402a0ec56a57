"""The tensors an engine's ``load_weights`` ignores on purpose, declared by its integration: never
read (the load skips them) or handed over without the duty to read them."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Skip:
    """Tensors an engine's ``load_weights`` ignores on purpose, declared by its integration.

    ``read``: False for tensors tpload never reads (the engine has no parameter for them, e.g. MTP
    layers; they become load skips); True for tensors handed over anyway, whose consumption is not
    required (e.g. a tied ``lm_head``, which the engine may or may not read)."""

    glob: str
    reason: str
    read: bool

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.glob)


def declared_skips(model_config: Mapping[str, object]) -> tuple[Skip, ...]:
    """What vLLM's (and SGLang's, which follows it) Llama/Qwen/DeepSeek ``load_weights`` skip, from
    the model's config (the engine's config object as a dict, so class defaults are included):

    * the MTP layers ``model.layers.{num_hidden_layers + i}`` (DeepSeek-V3 style): the main model
      has no parameter for them; engines load them only into a separate draft model;
    * ``lm_head.*`` when ``tie_word_embeddings``: the head is the embedding (``skip_prefixes``);
    * rotary tables (``rotary_emb.inv_freq``, ``cos_cached``, ``sin_cached``): computed, never
      loaded.
    """
    out = []
    layers, mtp = (
        model_config.get("num_hidden_layers"),
        model_config.get("num_nextn_predict_layers"),
    )
    if isinstance(layers, int) and isinstance(mtp, int) and not isinstance(mtp, bool):
        out += [
            Skip(
                f"model.layers.{layers + i}.*",
                f"MTP layer {layers + i} (num_hidden_layers is {layers}): "
                "loaded only into a draft model, never read",
                read=False,
            )
            for i in range(max(0, mtp))
        ]
    if model_config.get("tie_word_embeddings") is True:
        out.append(
            Skip(
                "lm_head.*", "tie_word_embeddings: the engine's lm_head is embed_tokens", read=True
            )
        )
    out += [
        Skip(f"*.rotary_emb.{t}", "rotary tables: the engine computes them", read=True)
        for t in ("inv_freq", "cos_cached", "sin_cached")
    ]
    return tuple(out)


def engine_skips(model_config: Mapping[str, object]) -> tuple[str, ...]:
    """The load skips of :func:`declared_skips`: the globs tpload never reads."""
    return tuple(s.glob for s in declared_skips(model_config) if not s.read)

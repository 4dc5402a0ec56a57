"""vLLM's ``--load-format tpload``: a plugin (entry point ``vllm.general_plugins``) and its loader.

    vllm serve DIR --tensor-parallel-size 8 --load-format tpload \\
        --model-loader-extra-config '{"verify": "node", "report": "/tmp/load.json"}'

vLLM runs :func:`register` in every process, TP workers included; it registers the format and
imports nothing of tpload's load path (torch kernels, numba): that happens in the first
``load_weights``. Each TP worker then loads its own windows with :func:`tpload.load` on vLLM's TP
group (the exchange on its CPU group), hands them to vLLM's own ``model.load_weights`` as
window tensors (integrations/handoff.py: vLLM's name mapping and sharding run unchanged, and a
loader asking for bytes outside the window fails the start; so does a tensor no loader read,
unless it is one vLLM skips on purpose, declared by :func:`_skips`), and vLLM's
``process_weights_after_loading`` runs as usual. docs/engines.md says what is checked and why.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from torch import nn
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

if TYPE_CHECKING:  # the plugin imports nothing of tpload's but this module when vLLM loads it
    from .engine_objects import VllmModelConfig
    from .skips import Skip

__all__ = ["LOAD_FORMAT", "REFRESH_BACKEND", "TploadModelLoader", "register"]

LOAD_FORMAT = "tpload"
REFRESH_BACKEND = "tpload"  # WeightTransferConfig(backend=...): vllm_refresh.py, vllm_trainer.py
log = init_logger("vllm.tpload")  # a child of vLLM's logger: its format and level


def register() -> None:
    """The ``vllm.general_plugins`` hook: add ``--load-format tpload`` and the weight-transfer
    backend ``tpload`` on both sides (worker and trainer: docs/refresh.md), safe to run many
    times: vLLM's weight-transfer registries refuse a name twice, and plugins, tpload's trainer
    module and tests may all register. The backends are registered by module name, imported only
    when vLLM creates one."""
    from vllm.distributed.weight_transfer import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    if _LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is not TploadModelLoader:
        register_model_loader(LOAD_FORMAT)(TploadModelLoader)
    for factory, module, cls in (
        (WeightTransferEngineFactory, "vllm_refresh", "TploadWeightTransferEngine"),
        (WeightTransferTrainerFactory, "vllm_trainer", "TploadTrainerEngine"),
    ):
        if REFRESH_BACKEND not in factory._registry:
            factory.register_engine(REFRESH_BACKEND, f"{__package__}.{module}", cls)


class TploadModelLoader(BaseModelLoader):
    """Loads each TP worker's verified windows straight into vLLM's parameters."""

    def download_model(self, model_config: VllmModelConfig) -> None:
        self._checkpoint(model_config)

    def load_weights(self, model: nn.Module, model_config: VllmModelConfig) -> None:
        from vllm.distributed import get_pp_group, get_tp_group

        from .engine import EngineLoad
        from .gguf_names import gguf_skips

        if get_pp_group().world_size > 1:
            raise ValueError(
                "--load-format tpload loads tensor-parallel workers only; pipeline parallelism "
                f"(pipeline_parallel_size {get_pp_group().world_size}) is not supported"
            )
        tp = get_tp_group()
        device = next(model.parameters()).device
        job = EngineLoad(
            "vllm",
            self._checkpoint(model_config),
            dict(self.load_config.model_loader_extra_config or {}),
            group=tp.device_group,
            cpu_group=tp.cpu_group,
            rank=tp.rank_in_group,
            world=tp.world_size,
            engine_device=device,
            log=log,
        )
        job.run(
            lambda weights: model.load_weights(weights),
            _expected(model, model_config),
            skips=gguf_skips(_skips(model_config), job.checkpoint),
            gguf_names=lambda: _gguf_names(model_config),
        )

    @staticmethod
    def _checkpoint(model_config: VllmModelConfig) -> str:
        """The checkpoint: ``model`` itself (a folder, or a ``.gguf`` file as vLLM takes one), or
        its hub snapshot (downloaded if missing)."""
        model: str = model_config.model
        if os.path.isdir(model) or (model.endswith(".gguf") and os.path.isfile(model)):
            return model
        from huggingface_hub import snapshot_download

        folder: str = snapshot_download(
            model_config.model,
            revision=model_config.revision,
            allow_patterns=["*.safetensors", "*.json"],
        )
        return folder


def _skips(model_config: VllmModelConfig) -> tuple[Skip, ...]:
    """What vLLM's load_weights skips on purpose (MTP layers, a tied lm_head, rotary tables), from
    the config object vLLM built the model from: its class defaults count (a config.json without
    ``tie_word_embeddings`` ties or not as its transformers class says), as they do for vLLM."""
    from .skips import declared_skips

    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    return declared_skips(hf.to_dict())


def _gguf_names(model_config: VllmModelConfig) -> dict[str, str]:
    """For a GGUF checkpoint: {GGUF name: HF name} as vLLM's GGUF loader maps it (gguf_names.py)."""
    from .gguf_names import vllm_weights_map

    return vllm_weights_map(
        model_config.hf_config, trust_remote_code=model_config.trust_remote_code
    )


def _expected(model: nn.Module, model_config: VllmModelConfig) -> set[str] | None:
    """Parameters vLLM's load must fill (None: not tracked, as vLLM's default loader does for a
    quantized model, whose scales it may build itself)."""
    if model_config.quantization is not None:
        return None
    return {name for name, _ in model.named_parameters()}

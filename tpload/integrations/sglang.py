"""SGLang: a loader class to pass as ``load_format`` (SGLang takes a ``BaseModelLoader`` subclass
programmatically), with the same hand-off as vLLM's plugin (integrations/engine.py):

    import sglang as sgl
    from tpload.integrations.sglang import TploadModelLoader
    engine = sgl.Engine(model_path=DIR, tp_size=8, load_format=TploadModelLoader,
                        model_loader_extra_config={"verify": "node"})

Not tested against a running SGLang: its only published build needs CUDA (``sglang`` 0.5.23
requires torch 2.14.1 with CUDA, flashinfer, DeepEP and DeepGEMM), and its CPU backend must be
built from source, which this project's CPU machines cannot do (docs/engines.md). The code
follows SGLang 0.5.23's ``model_loader/loader.py`` (``DefaultModelLoader.load_model``).
"""

from __future__ import annotations

import json
import logging

import torch
from torch import nn

try:
    from sglang.srt.distributed import get_tp_group
    from sglang.srt.model_loader.loader import (
        BaseModelLoader,
        DefaultModelLoader,
        _get_quantization_config,
        _initialize_model,
    )
    from sglang.srt.model_loader.utils import set_default_torch_dtype
except ImportError as e:  # pragma: no cover - SGLang is not installed where the tests run
    raise ImportError(f"tpload.integrations.sglang needs SGLang ({e}); pip install sglang") from e

from .engine_objects import SglangDeviceConfig, SglangModelConfig

__all__ = ["TploadModelLoader"]

log = logging.getLogger("sglang.tpload")  # a child of SGLang's logger, as its loaders use


class TploadModelLoader(BaseModelLoader):
    """Each TP worker loads its verified windows and hands them to the model's own
    ``load_weights``."""

    def download_model(self, model_config: SglangModelConfig) -> None:
        pass  # a local folder (or a hub snapshot already downloaded): tpload reads it where it is

    def load_model(
        self, *, model_config: SglangModelConfig, device_config: SglangDeviceConfig
    ) -> nn.Module:
        from .engine import EngineLoad

        target = torch.device(device_config.device)
        with set_default_torch_dtype(model_config.dtype):
            with target:
                model = _initialize_model(
                    model_config,
                    self.load_config,
                    _get_quantization_config(model_config, self.load_config),
                )
            tp = get_tp_group()
            extra = self.load_config.model_loader_extra_config or {}
            job = EngineLoad(
                "sglang",
                model_config.model_path,
                json.loads(extra) if isinstance(extra, str) else extra,
                group=tp.device_group,
                cpu_group=tp.cpu_group,
                rank=tp.rank_in_group,
                world=tp.world_size,
                engine_device=target,
                log=log,
            )
            job.run(
                lambda weights: DefaultModelLoader.load_weights_only(model, weights, target), None
            )
            DefaultModelLoader.postprocess_weights(model, target)
        return model.eval()

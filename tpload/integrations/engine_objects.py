"""The engines' objects as tpload's integrations annotate them: vLLM's, SGLang's and transformers'
configs, workers and clients, and the torch ops an engine's weight loader calls on a window.

None of the engines is installed where .ci/run type-checks (pyproject.toml's mypy overrides ignore
their imports, so every name they export is ``Any`` there), and torch is not read. Each alias below
is that ``Any`` under a name that says what the object is: this is the one module of integrations/
that says ``Any``, and the others annotate with these names (``worker: VllmWorker``). It imports
nothing but ``typing``, so any module may import it at run time (vLLM's plugin included: no engine
is imported through it).

What is imported from an engine at run time (a base class, a function, a registry) is imported
from the engine where it is used: those names are ``Any`` too, and a class built on one is listed
in pyproject.toml's ``disallow_subclassing_any`` override.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

# ---------------------------------------------------------------- vLLM (vllm_*.py, vllm.py)

VllmConfig: TypeAlias = Any
"""``vllm.config.VllmConfig``: the engine's whole config, as a weight-transfer engine gets it."""

VllmModelConfig: TypeAlias = Any
"""``vllm.config.ModelConfig``: the served model (``model``, ``revision``, ``hf_config``,
``quantization``...)."""

VllmWeightTransferConfig: TypeAlias = Any
"""``vllm.config.WeightTransferConfig``: the weight-transfer backend's config (its name only)."""

VllmWorker: TypeAlias = Any
"""``vllm.v1.worker.gpu_worker.Worker``: one worker process's worker (its ``model_runner``, its
weight-update session flag)."""

VllmLLM: TypeAlias = Any
"""``vllm.LLM``: an in-process engine, as a trainer drives it."""

VllmWeightSyncClient: TypeAlias = Any
"""``vllm.distributed.weight_transfer.base.VLLMWeightSyncClient``: what a trainer calls the
engine's four weight-transfer methods through (an :class:`~.vllm_trainer.LLMWeightSync`, or vLLM's
HTTP client, which has a ``base_url``)."""

VllmWeightSource: TypeAlias = Any
"""``vllm.distributed.weight_transfer.base.WeightSource``: the trainer's tensors
(``ModuleSource``); the sender reads it as :class:`tpload.refresh.trainer.WeightSource`."""

# ---------------------------------------------------------------- SGLang (sglang.py)

SglangModelConfig: TypeAlias = Any
"""``sglang.srt.configs.model_config.ModelConfig``: the served model (``model_path``,
``dtype``...)."""

SglangDeviceConfig: TypeAlias = Any
"""``sglang.srt.configs.device_config.DeviceConfig``: the worker's device (``device``)."""

# ---------------------------------------------------------------- transformers (gguf_names.py)

HfConfig: TypeAlias = Any
"""``transformers.PretrainedConfig``: the model config vLLM built its model from (``model_type``,
``get_text_config()``...)."""

# ------------------------------------------------------- torch's protocol (window_tensor.py)
# ``__torch_function__`` and ``__torch_dispatch__`` are called with whatever op an engine's loader
# ran on a window, with that op's arguments, and return that op's result: any of each.

TorchOp: TypeAlias = Callable[..., Any]
"""The op called on a window: a torch function, a Tensor method, an attribute's getter, an ATen
overload (from C)."""

OpArgs: TypeAlias = tuple[Any, ...]
"""The op's positional arguments (the window among them)."""

OpKwargs: TypeAlias = dict[str, Any]
"""The op's keyword arguments."""

OpResult: TypeAlias = Any
"""The op's result: a tensor, a size, a count, a flag, a string, a device..."""

"""tpload's tools: what serves the load path from outside it.

Synthetic and published-layout checkpoints (``synth``, ``synth_gguf``, ``published``; the families'
data in ``tpload/configs/presets/``, read by ``families``), the bench
(``bench``, ``bench_bandwidth``, ``bench_worker`` with ``bench_job``, ``bench_engine``,
``bench_replicas``), what a layout costs (``sizing``) and the offline
writers (``offline``: manifests, stored predictions, the blake3 sidecar; ``export``). Tools call the
core through its face for them, :mod:`tpload.toolkit` (and ``tpload``, ``tpload.model``); the core
never imports a tool (import-linter's contracts in pyproject.toml hold both). The offline writers
still pass their bytes through the core's gate (``toolkit.gate_at_rest``).
"""

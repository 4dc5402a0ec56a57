"""tpload's tools: what serves the load path from outside it.

Synthetic and published-layout checkpoints (``synth``, ``synth_gguf``, ``published``; the families'
data in ``tpload/configs/presets/``, read by ``families``), the bench
(``bench``, ``bench_bandwidth``, ``bench_worker`` with ``bench_job``, ``bench_engine``,
``bench_replicas``; a process's first call: ``first_call``), what a layout costs (``sizing``) and
the offline writers (``offline``: manifests, stored predictions, the blake3 sidecar; ``export``).
Tools import the core's modules by their public names (docs/development.md); the core never imports
a tool (import-linter's ``core-not-tools``). The offline writers still pass their bytes through the
core's gate (``sources/hashing.py``'s ``at_rest``).
"""

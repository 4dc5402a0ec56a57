"""Serving engines loading through tpload: ``vllm`` (a ``vllm.general_plugins`` entry point adding
``--load-format tpload``) and ``sglang`` (a loader class for its ``load_format``); ``engine`` and
the hand-off (``handoff``, with ``handed``, ``skips`` and ``window_tensor``) are what they share.
Nothing here imports an engine until the engine imports it."""

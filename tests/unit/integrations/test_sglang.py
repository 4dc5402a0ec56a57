"""The SGLang adapter without SGLang (it publishes CUDA builds only; docs/engines.md): importing it
says what is missing instead of failing somewhere inside."""

from __future__ import annotations

import importlib.util
import sys

import pytest


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here"
)
def test_without_sglang_the_adapter_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tpload.integrations.sglang", raising=False)
    with pytest.raises(
        ImportError, match=r"tpload.integrations.sglang needs SGLang .*pip install sglang"
    ):
        importlib.import_module("tpload.integrations.sglang")

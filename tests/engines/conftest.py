"""The engine tier's shared fixture: the vLLM venv's python (built once, cached outside the clone),
or a skip saying why there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from .vllm_env import vllm_python


@pytest.fixture(scope="module")
def python() -> Path:
    found, why = vllm_python()
    if found is None:
        pytest.skip(why)
    return found

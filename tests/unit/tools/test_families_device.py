"""Every published family's miniature loaded on a GPU (cuda:0, one rank), packed and expanded,
against the independent reference: the device decodes of NVFP4, MXFP4 blocks and FP8 with
BF16/E8M0 scales, and the stacked views' device fingerprints. Skipped without CUDA (the CPU runs
the same comparison under torchrun in tests/integration/test_families.py); launch/gpu-check.sh
runs it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tpload
from tpload.tools.published import write_published

from ...formats_reference import Family

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PRESETS = {
    "deepseek-v3": "deepseek-v3-tiny",
    "deepseek-v4": "deepseek-v4-tiny",
    "gpt-oss": "gpt-oss-tiny",
    "nvfp4": "nvfp4-tiny",
    "qwen3-fp8": "qwen3-fp8-tiny",
    "llama": "llama-tiny",
}


@pytest.mark.parametrize("kind", ["packed", "expanded"])
@pytest.mark.parametrize("family", sorted(PRESETS))
def test_a_family_loads_exactly_on_cuda(
    family: str, kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = write_published(tmp_path_factory.mktemp(family) / "ckpt", PRESETS[family])
    shards = tpload.load(root, kind=kind, device="cuda:0", progress=False)
    try:
        got = {
            n: t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for n, t in shards.state_dict().items()
        }
        assert shards.report.mine.device_checked > 0 or kind == "expanded"
    finally:
        shards.release()
    want = Family(family, root).expected(1, 1, 0, kind)
    assert set(got) == set(want)
    bad = [n for n, a in want.items() if got[n] != np.ascontiguousarray(a).tobytes()]
    assert not bad, bad[:10]

"""The exact count behind the fingerprint pass's NaN and inf flag (kernels/fingerprint.py
``count_nonfinite``, which words a refresh's refusal) against torch's own isfinite, on every
floating dtype with an inf, across the slices it reads by."""

from __future__ import annotations

import pytest
import torch

from tpload.kernels import fingerprint

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


@pytest.mark.parametrize("stored", sorted(DTYPES))
def test_nonfinite_counts_what_torch_counts(stored: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "_SLICE", 1000)  # several slices, and a hit in a later one
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(5000, generator=g) * 1e4).to(DTYPES[stored])
    raw = t.view(torch.uint8).numpy()
    assert fingerprint.count_nonfinite(raw, stored) is None
    for at, value in ((4321, float("nan")), (2500, float("-inf")), (4999, float("inf"))):
        t[at] = value
    got = fingerprint.count_nonfinite(t.view(torch.uint8).numpy(), stored)
    assert got == (int((~torch.isfinite(t)).sum()), 2500)
    big = torch.full((8,), torch.finfo(DTYPES[stored]).max, dtype=DTYPES[stored])
    assert fingerprint.count_nonfinite(big.view(torch.uint8).numpy(), stored) is None


def test_integer_and_fp8_windows_are_not_floating_for_this_check() -> None:
    raw = torch.full((64,), 0xFF, dtype=torch.uint8).numpy()
    assert fingerprint.count_nonfinite(raw, "U8") is None
    assert (
        fingerprint.count_nonfinite(raw, "F8_E4M3") is None
    )  # FP8 NaN codes are the codecs' check
    assert fingerprint.count_nonfinite(raw, "I32") is None

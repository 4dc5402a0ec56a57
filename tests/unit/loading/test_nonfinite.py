"""What the loop says of a window the fingerprint pass flagged non-finite (loading/loop.py's
``nonfinite_problem``): the exact count where the counter agrees, and a refusal on the flag alone
where it would not (a zero count would pass the settle silently)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tpload.loading.loop import nonfinite_problem


def test_a_flagged_window_is_counted_exactly_and_the_first_named() -> None:
    values = np.ones(1000, dtype=ml_dtypes.bfloat16)
    values[[17, 400]] = np.nan
    values[999] = np.inf
    count, what = nonfinite_problem(values.view(np.uint8), "BF16")
    assert count == 3
    assert "the first at element 17" in what and "allow_nonfinite" in what


def test_a_flag_the_counter_cannot_confirm_still_refuses() -> None:
    count, what = nonfinite_problem(np.ones(64, dtype=np.float32).view(np.uint8), "F32")
    assert count == 1  # never 0: the settle drops a zero count
    assert "flagged by the fingerprint pass" in what

"""The Wilson interval against values computed by hand."""
from __future__ import annotations

import math

import pytest

from core.stats import wilson_interval


def test_wilson_matches_hand_computed_values():
    # 5 of 10, z = 1.96: centre 0.5, half = 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341...
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.236590, abs=1e-5) and high == pytest.approx(0.763410, abs=1e-5)
    # 0 of 20: low 0, high z^2/n / (1 + z^2/n) = 0.19208 / 1.19208 = 0.161130...
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.161130), abs=1e-5)
    # 20 of 20 mirrors 0 of 20
    assert wilson_interval(20, 20) == pytest.approx((1 - 0.161130, 1.0), abs=1e-5)
    # 81 of 90 (p = 0.9): centre 0.921342 / 1.042684 = 0.88363, half 1.96 * 0.033445 / 1.042684 = 0.06287
    low, high = wilson_interval(81, 90)
    assert low == pytest.approx(0.82076, abs=1e-4) and high == pytest.approx(0.94649, abs=1e-4)


def test_wilson_narrows_with_more_episodes_and_z():
    small, large = wilson_interval(3, 10), wilson_interval(300, 1000)
    assert small[1] - small[0] > large[1] - large[0]
    narrow = wilson_interval(3, 10, z=1.0)
    assert small[0] < narrow[0] < 0.3 < narrow[1] < small[1]
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert math.isclose(sum(wilson_interval(7, 14)), 1.0)  # symmetric around 0.5


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(-1, 10)

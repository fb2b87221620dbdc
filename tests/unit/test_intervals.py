"""t-intervals on data whose interval is known."""

import math

import pytest

from perm_core.applications.intervals import paired_difference, t_interval


def test_t_interval_of_one_to_five():
    # mean 3, s = sqrt(2.5), t(0.975, 4) = 2.7764451; half-width 2.7764451 * sqrt(2.5) / sqrt(5) = 1.9632432
    interval = t_interval([1, 2, 3, 4, 5])
    assert interval.mean == 3 and interval.n == 5
    assert interval.half_width == pytest.approx(1.9632432, abs=1e-6)
    assert (interval.low, interval.high) == pytest.approx((1.0367568, 4.9632432), abs=1e-6)


def test_t_interval_of_two_values_and_a_99_percent_level():
    # n = 2: t(0.975, 1) = 12.7062047; s = sqrt(2), half-width 12.7062047 * sqrt(2) / sqrt(2)
    assert t_interval([0, 2]).half_width == pytest.approx(12.7062047, abs=1e-6)
    # t(0.995, 9) = 3.2498355 on 0..9: s = sqrt(9.1666...)
    interval = t_interval(range(10), confidence=0.99)
    assert interval.half_width == pytest.approx(3.2498355 * math.sqrt(55 / 6) / math.sqrt(10), abs=1e-6)


def test_constant_values_give_a_point_and_the_sides_are_told_apart():
    interval = t_interval([0.7] * 6)
    assert interval.low == pytest.approx(0.7) and interval.high == pytest.approx(0.7)
    assert t_interval([5, 6, 7]).above(0) and not t_interval([1, 2, 3]).above(0)  # 1, 2, 3: -0.48 to 4.48
    assert t_interval([-7, -6, -5]).below(0) and not t_interval([-3, -2, -1]).below(0)


def test_paired_difference_is_the_interval_of_the_differences():
    after, before = [5, 7, 9, 8, 6], [4, 5, 6, 4, 1]  # differences 1..5
    assert paired_difference(after, before) == t_interval([1, 2, 3, 4, 5])
    with pytest.raises(ValueError):
        paired_difference([1, 2], [1])


@pytest.mark.parametrize("values,confidence", [([1.0], 0.95), ([1, 2], 1.0), ([1, 2], 0.0)])
def test_bad_input_is_refused(values, confidence):
    with pytest.raises(ValueError):
        t_interval(values, confidence)

"""stats.window: a recorded round cut by GPU time (bins, steps, spread) and round 0's first member."""
import math

import pytest

from tptune.stats.window import (bin_profile, first_member_effect, largest_step, round_values, spread,
                                 time_bins)


def test_time_bins_group_iterations_by_their_start():
    # starts at 0, 4, 8, 12, 16 ms: the third (starts at 8) opens bin 1 of 10 ms... and 12, 16 join it
    assert time_bins([4.0, 4.0, 4.0, 4.0, 4.0], 10.0) == [[4.0, 4.0, 4.0], [4.0, 4.0]]
    # an iteration longer than a bin leaves the bins it spans without a start: they are not listed
    assert time_bins([25.0, 1.0], 10.0) == [[25.0], [1.0]]


def test_bin_profile_is_each_bins_mean_over_the_rounds_against_the_first_bin():
    rounds = [[1.0] * 10 + [1.1] * 10, [1.0] * 10 + [1.3] * 10]   # bins of 10 ms: the second 20% slower on average
    prof = bin_profile(rounds, 10.0, 2)
    assert prof[0] == 0.0
    # bin 1 starts at 10 ms: round 0 puts 1.1 x 10 there (its first starts at 10.0), round 1 1.3s
    assert prof[1] == pytest.approx((1.1 + 1.3) / 2 / 1.0 - 1)
    with pytest.raises(ValueError, match="round 1 holds 1 bins of 10 ms, fewer than 2"):
        bin_profile([[1.0] * 20, [1.0] * 5], 10.0, 2)


def test_largest_step_between_consecutive_bin_medians():
    its = [1.0] * 10 + [1.2] * 10 + [1.1] * 10     # 10 ms bins: medians 1.0, 1.2, 1.1 (bins start at 0, 10, 22)
    assert largest_step(its, 10.0) == pytest.approx(0.2)
    assert largest_step([1.0, 1.0], 10.0) is None   # one bin: no step


def test_round_values_and_spread():
    rounds = [[1.0, 1.0, 9.0], [2.0, 2.0, 9.0]]
    assert round_values(rounds, 2.0, 1) == [1.0, 2.0]          # a 2 ms window times the first two iterations
    # a 2 ms skip ends on an iteration's end: round 0 skips two iterations, round 1 one
    assert round_values(rounds, 2.0, 1, skip_ms=2.0) == [9.0, 2.0]
    assert spread([1.0, 1.5, 1.2]) == pytest.approx(0.5)


def test_first_member_effect_is_round_zeros_log_ratio_less_the_later_mean():
    first = {0: 0.98, 1: 1.0, 2: 1.0}
    second = {0: 1.0, 1: 1.0, 2: 1.0}
    assert first_member_effect(first, second) == pytest.approx(math.log(0.98))
    assert first_member_effect({1: 1.0, 2: 1.0, 3: 1.0}, second) is None
    assert first_member_effect({0: 1.0, 1: 1.0}, second) is None

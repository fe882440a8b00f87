"""The candidate capacities T and the checks of a given list (tptune.packing.capacity)."""
import numpy as np
import pytest

from tptune.errors import ConfigError
from tptune.packing.capacity import candidate_capacities, capacity_problems, fp8_multiple


def test_default_candidates_span_the_longest_to_twice_the_budget():
    lengths = np.array([100, 2999, 3000])
    # the longest rounded up to 128, the budget, twice the budget
    assert candidate_capacities(lengths, 8192, tp=2, fp8=False) == [3072, 8192, 16384]
    assert candidate_capacities(lengths, 8000, tp=2, fp8=False) == [3072, 8064, 16000]    # 8000 rounded up
    assert candidate_capacities(np.array([9000]), 8192, tp=4, fp8=False) == [9088, 16384]    # above the budget
    assert candidate_capacities(lengths, 8192, tp=8, fp8=True, recipe="mxfp8") == [3072, 8192, 16384]
    assert all(c % 1024 == 0 for c in candidate_capacities(np.array([5000]), 6000, tp=8, fp8=True, recipe="mxfp8"))


def test_fp8_multiple():
    assert fp8_multiple(2) == 32 and fp8_multiple(8) == 128 and fp8_multiple(4, "mxfp8") == 512


def test_no_candidate_holds_the_longest():
    with pytest.raises(ConfigError, match="longer than every candidate capacity"):
        candidate_capacities(np.array([20000]), 8192, tp=2, fp8=False)


def test_a_list_overrides_and_is_checked():
    lengths = np.array([1000, 4000])
    assert candidate_capacities(lengths, 8192, tp=4, fp8=False, override=[8192, 4096]) == [4096, 8192]
    with pytest.raises(ConfigError) as e:
        candidate_capacities(lengths, 8192, tp=4, fp8=True, override=[4096, 4128, 2048, 4096, "x"])
    msg = str(e.value)
    assert "capacities.1' = 4128: expected a multiple of 64 (FP8 at TP 4: 16 x TP" in msg
    assert "capacities.2' = 2048: shorter than the longest sequence (4000 tokens)" in msg
    assert "[4096] listed twice" in msg and "capacities.4' = 'x'" in msg
    assert capacity_problems([8190], None, tp=4, fp8=False) == [
        "field 'workload.packing.capacities.0' = 8190: expected a multiple of TP 4 (userbuffers split T into TP "
        "chunks); nearest: 8192"]
    assert capacity_problems([], None, 2, False)[0].endswith("expected a non-empty list of token counts")

"""Overlap verdict of a candidate vs its no-overlap baseline."""

from pathlib import Path

import polars as pl
import pytest

from tptune.trace import VerdictThresholds, overlap_verdict, summarize, trace_metrics

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"


def _summary(name: str) -> pl.DataFrame:
    return summarize(trace_metrics([TRACES / name]))


def test_userbuffers_qkv_overlaps_vs_nccl_baseline():
    verdict, reason = overlap_verdict(_summary("te_qkv_ub.rank0.pt.trace.json.gz"),
                                      _summary("te_qkv_base.rank0.pt.trace.json.gz"))
    assert verdict == "overlapped", reason
    assert reason.startswith("all criteria met") and "(c)" in reason


def test_baseline_vs_itself_fails_wall_criterion_and_says_why():
    base = _summary("te_qkv_base.rank0.pt.trace.json.gz")
    verdict, reason = overlap_verdict(base, base)
    assert verdict == "not overlapped"
    assert "(d) wall" in reason and "1.00x" in reason and "(a)" not in reason


def test_each_threshold_is_reported_with_numbers():
    base = _summary("te_qkv_base.rank0.pt.trace.json.gz")
    slow = base.with_columns(pl.col("gemm_ms_max") * 1.5, pl.col("comm_ms_max") * 2, pl.col("overlap_ms_max") * 0)
    verdict, reason = overlap_verdict(slow, base)
    assert verdict == "not overlapped"
    for crit in ("(a) GEMM", "(b) comm", "(c) overlapped comm", "(d) wall"):
        assert crit in reason
    assert "1.50x" in reason and "2.00x" in reason


def test_no_communication_and_threshold_overrides():
    base = _summary("te_qkv_base.rank0.pt.trace.json.gz")
    no_comm = base.with_columns(pl.col("comm_ms_max") * 0, pl.col("overlap_ms_max") * 0)
    assert overlap_verdict(no_comm, base)[0] == "no communication"
    ub = _summary("te_qkv_ub.rank0.pt.trace.json.gz")
    assert overlap_verdict(ub, base, {"min_overlap_fraction": 1.0})[0] == "not overlapped"
    assert overlap_verdict(ub, base, VerdictThresholds(max_gemm_ratio=1.0))[0] == "not overlapped"
    with pytest.raises(ValueError, match="unknown verdict thresholds"):
        overlap_verdict(ub, base, {"max_gem_ratio": 2})

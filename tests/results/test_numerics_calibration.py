"""The committed GPU calibration of the numerics rule (results/numerics-calibration, issue 33): the factors
sit above every legitimate setting's errors and below every corrupting pair's, on the files the GPUs wrote."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from numerics_calibration import runs, table  # noqa: E402
from tptune.stats.numerics import FACTOR_L2, FACTOR_MAX  # noqa: E402

POOLED = [r for r in table() if not r["run"].endswith("per-expert")]


def test_the_calibration_covers_tp2_tp4_fp8_and_moe():
    seen = {(r["model"], r["tp"], "fp8" in r["run"]) for r in POOLED}
    assert {("llama3-70b", 2, False), ("llama3-70b", 4, False), ("llama3-70b", 4, True),
            ("qwen3-30b-a3b", 2, False)} <= seen
    for r in POOLED:   # no overlap, TE defaults and NVIDIA's presets at least
        assert {"none", "ub.te"} <= set(r["legit_settings"]) and len(r["legit_settings"]) >= 4


def test_every_legitimate_setting_passes_well_inside_the_factors():
    for r in POOLED:
        assert r["legit_max_l2"] < FACTOR_L2 / 1.3, r
        assert r["legit_max_maxdiff"] < FACTOR_MAX / 2, r
    for name, run in runs().items():
        if name.endswith("per-expert"):
            continue
        for setting, point in run["settings"].items():
            if setting not in run["pairs"]:
                assert point.status == "ok" and point.correct is True, (name, setting)


def test_the_bf16_mismatched_pairs_fail_by_far_or_te_refuses_them():
    for r in POOLED:
        if "fp8" in r["run"]:
            continue
        assert r["pairs"], r["run"]
        for s, p in r["pairs"].items():
            if "worst" in p:
                assert p["failed"] and p["l2_ratio"] > 5 * FACTOR_L2, (r["run"], s, p)
            else:
                assert p["status"] == "failed" and "comm_gemm_overlap" in p["error"], (r["run"], s, p)


def test_judging_each_expert_alone_fails_no_overlap_itself():
    """Why routed experts are pooled per layer: one expert's gradient follows routing flips."""
    (r,) = [r for r in table() if r["run"].endswith("per-expert")]
    assert r["legit_max_l2"] > FACTOR_L2

"""search.session_noise: the round-to-round noise inside a run's sessions against what its round budget
can resolve, on synthetic sessions and on the committed GPU sessions; and the report's warning."""
import json
import math
import random

import pytest

from conftest import ROOT
from tptune.decide.summary import measurement_summary
from tptune.records.measured_point import MeasuredPoint, TimingSummary
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session, load_sessions
from tptune.stats import session_noise as sn
from tptune.stats.rounds import log_ratio_interval

LEADER, A, B = "qkv-tp2-ub.te", "qkv-tp2-none", "qkv-tp2-ub.nemo_tp4"


def _write_session(run_dir, rel, rounds: dict[str, list[float]], leader=LEADER, max_rounds=6, ids=None):
    """sessions/<rel> as Launcher.session writes it: session.json and a run.json per member."""
    d = run_dir / "sessions" / rel
    runs = {}
    for cid, vals in rounds.items():
        m = d / cid.split("-", 2)[2]
        m.mkdir(parents=True)
        rid = (ids or {}).get(cid, list(range(len(vals))))
        (m / "run.json").write_text(json.dumps({
            "case": cid, "status": "ok", "session": rel,
            "timing": {"total_ms": {"rounds": vals, "round_ids": rid}}}))
        runs[cid] = f"{m.name}/run.json"
    (d / "session.json").write_text(json.dumps({
        "session": rel, "runs": runs, "members": list(rounds), "contenders": list(rounds),
        "leader": leader, "rounds": max(len(v) for v in rounds.values()), "max_rounds": max_rounds}))


def _noisy(base: float, sd: float, n: int, rng: random.Random) -> list[float]:
    return [base * math.exp(rng.gauss(0.0, sd)) for _ in range(n)]


def test_pairs_are_the_common_rounds_of_each_contender_with_the_leader():
    assert sn.pair_log_ratios({0: 2.0, 1: 2.0, 3: 4.0}, {0: 1.0, 1: 2.0, 2: 9.0}) == pytest.approx(
        [math.log(2.0), 0.0])
    rec = {"leader": LEADER, "contenders": [LEADER, A, B]}
    pt = lambda vals: MeasuredPoint("x", "ok", timing={"total_ms": TimingSummary(  # noqa: E731
        rounds=tuple(vals), round_ids=tuple(range(len(vals))))})
    runs = {LEADER: pt([1.0, 1.0, 1.0]), A: pt([1.1, 1.2, 1.0]), B: pt([1.0])}   # B: one round, no pair
    assert sn.session_pairs(rec, runs) == [pytest.approx([math.log(1.1), math.log(1.2), 0.0])]
    assert sn.session_pairs({"leader": None, "contenders": [A]}, runs) == []
    failed = dict(runs, **{LEADER: MeasuredPoint(LEADER, "failed")})
    assert sn.session_pairs(rec, failed) == []


def test_pooled_and_typical_sd_on_synthetic_rounds():
    rng = random.Random(7)
    pairs = [[rng.gauss(0.0, 0.01) for _ in range(6)] for _ in range(60)]
    sd, df = sn.pooled_sd(pairs)
    assert df == 300 and sd == pytest.approx(0.01, rel=0.12)
    assert sn.robust_sd(pairs) == pytest.approx(0.01, rel=0.15)
    # one bad round of one pair lifts the pooled sd, not the typical one
    spoiled = [list(p) for p in pairs]
    spoiled[0][3] += 0.5
    assert sn.pooled_sd(spoiled)[0] > 2 * sd
    assert sn.robust_sd(spoiled) == pytest.approx(sn.robust_sd(pairs), rel=0.05)
    assert sn.pooled_sd([[0.1]]) == (None, 0) and sn.robust_sd([]) is None


def test_resolvable_sd_is_where_a_tie_at_one_just_clears_the_margin():
    lim = sn.resolvable_sd(0.02, 6)
    assert lim == pytest.approx(0.01887, abs=2e-5)
    # a 6-round tie at exactly 1.00 with that sd has its interval's ends at 1/1.02 .. 1.02
    ds = [lim * x for x in (1, -1, 1, -1, 1, -1)]
    sd = math.sqrt(sum(d * d for d in ds) / 5)
    r = log_ratio_interval([d * lim / sd for d in ds])
    assert r.hi == pytest.approx(1.02, abs=1e-6) and r.lo == pytest.approx(1 / 1.02, abs=1e-6)
    assert sn.resolvable_sd(0.02, 4) < lim < sn.resolvable_sd(0.02, 8)
    assert sn.resolvable_sd(0.02, 1) == 0.0


def test_a_run_whose_sessions_are_noisier_than_the_budget_resolves_is_warned(tmp_path):
    rng = random.Random(3)
    for k in range(3):   # qkv: 3% round-to-round, as the null pair on one H100 (results/noise-h100)
        _write_session(tmp_path, f"qkv/tp2/dgrad.bulk/step{k}",
                       {LEADER: _noisy(3.0, 0.021, 6, rng), A: _noisy(3.05, 0.021, 6, rng)})
    _write_session(tmp_path, "fc1/tp2/point",      # fc1: 0.5%, well inside
                   {"fc1-tp2-ub.te": _noisy(17.0, 0.0035, 6, rng), "fc1-tp2-none": _noisy(17.2, 0.0035, 6, rng)},
                   leader="fc1-tp2-ub.te")
    noise = sn.op_noise(load_sessions(RunDir(tmp_path)))
    assert set(noise) == {"qkv", "fc1"}
    assert noise["qkv"]["pairs"] == 3 and noise["qkv"]["sessions"] == 3 and noise["qkv"]["df"] == 15
    assert noise["qkv"]["typical_sd"] > 0.019 and noise["fc1"]["typical_sd"] < 0.01
    w = sn.noise_warning(noise, 0.02)
    assert w.startswith("session noise:") and "(qkv " in w and "fc1" not in w
    assert "with 6 rounds a tie resolves within the 2% margin only up to 1.9%" in w
    assert "timing.window_ms" in w
    assert "timing.iters" in sn.noise_warning(noise, 0.02, device="cpu")
    # a larger round budget resolves what 6 rounds could not
    for n in noise.values():
        n["max_rounds"] = 40
    assert sn.noise_warning(noise, 0.02) is None
    # measurement_summary puts it in the report's warning, beside the canary's
    s = measurement_summary(load_sessions(RunDir(tmp_path)), {}, 0.02)
    assert s["session_noisy"] and s["warning"].startswith("session noise:")
    assert s["session_noise_limits"]["qkv"] == pytest.approx(sn.resolvable_sd(0.02, 6))


def test_a_quiet_run_is_not_warned_and_rounds_pair_by_round_id(tmp_path):
    rng = random.Random(5)
    # the leader ran every round, the contender left after round 2: pairs use rounds 0-2 only
    lead = _noisy(3.0, 0.003, 6, rng)
    _write_session(tmp_path, "proj/tp2/point", {"proj-tp2-ub.te": lead, "proj-tp2-none": [x * 1.05 for x in lead[:3]]},
                   leader="proj-tp2-ub.te")
    noise = sn.op_noise(load_sessions(RunDir(tmp_path)))
    assert noise["proj"]["df"] == 2 and noise["proj"]["sd"] == pytest.approx(0.0, abs=1e-12)
    assert sn.noise_warning(noise, 0.02) is None
    assert measurement_summary(load_sessions(RunDir(tmp_path)), {}, 0.02)["warning"] is None


def test_committed_x2_runs(tmp_path):
    """The committed 2xH200 sessions: a quiet run and the FP8 run whose proj was host-bound at TP 2."""
    quiet = sn.op_noise(load_sessions(RunDir(ROOT / "results/stability-llama3-70b-x2/rep1")))
    assert set(quiet) == {"qkv", "proj", "fc1", "fc2", "layer"}
    assert all(n["typical_sd"] < 0.015 for n in quiet.values())
    assert sn.noise_warning(quiet, 0.02) is None
    fp8 = sn.op_noise(load_sessions(RunDir(ROOT / "results/fp8-llama3-70b-x2")))
    w = sn.noise_warning(fp8, 0.02)
    assert w is not None and "(proj " in w and fp8["proj"]["typical_sd"] > 0.1

"""figures: one definition per figure, on synthetic rounds and on the recorded sessions in results/."""
import json
import math
from pathlib import Path

import pytest

from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import read_point
from tptune.stats import bound, efficiency, finalists, host_evidence as host, pooled, wording
from tptune.stats.rounds import paired_ratio, point_rounds
from tptune.settings.blocks import Decision, Layer

RESULTS = Path(__file__).resolve().parents[2] / "results"
KNOBS = RESULTS / "knobs-llama3-70b-x2"


def pt(case, rounds, session="s"):
    return MeasuredPoint.from_dict({"case": case, "status": "ok", "session": session, "timing": {"total_ms": {
        "median": sorted(rounds)[len(rounds) // 2], "rounds": list(rounds), "round_ids": list(range(len(rounds)))}}})


NONE = pt("op-tp2-none", [10.0, 10.2, 9.9, 10.1, 10.0, 10.05])
BOUND = pt("op-tp2-nocomm", [9.0, 9.1, 8.95, 9.05, 9.0, 9.02])


def test_efficiency_is_the_ratio_of_mean_paired_differences_with_an_interval():
    chosen = pt("op-tp2-ub.a", [n - 0.5 * (n - b) for n, b in zip(point_rounds(NONE).values(),
                                                                  point_rounds(BOUND).values())])
    e = efficiency.op_efficiency(NONE, chosen, BOUND)
    assert e.value == pytest.approx(0.5) and e.rounds == 6 and e.capped is None and e.fault is None
    assert e.lo == pytest.approx(0.5) and e.hi == pytest.approx(0.5)   # exactly half in every round
    noisy = pt("op-tp2-ub.a", [9.5, 9.7, 9.35, 9.62, 9.45, 9.55])
    e = efficiency.op_efficiency(NONE, noisy, BOUND)
    assert 0 <= e.lo < e.value < e.hi <= 1 and e.shown().startswith(f"{100 * e.value:.0f}% [")


def test_a_setting_below_its_bound_within_the_noise_is_capped_at_100():
    chosen = pt("op-tp2-ub.a", [8.9, 9.2, 9.0, 9.0, 8.9, 9.1])   # beside the bound, round for round either side
    e = efficiency.op_efficiency(NONE, chosen, BOUND)
    assert e.raw > 1 and e.value == 1.0 and e.hi == 1.0 and e.capped == "at bound" and e.fault is None
    assert "%" not in e.shown().split(";")[0] and e.shown().startswith("at the bound")
    assert "100%" not in e.hides() and e.hides().startswith("hides all exposed communication")


def test_a_bound_slower_than_the_setting_beyond_the_noise_is_a_fault_not_a_percentage():
    chosen = pt("op-tp2-ub.a", [8.6, 8.7, 8.55, 8.65, 8.6, 8.62])   # 4-5% below the bound in every round
    e = efficiency.op_efficiency(NONE, chosen, BOUND)
    assert e.value is None and e.fault["lo"] > 1 and "%" not in e.shown() and "bound fault" in e.shown()
    faults = bound.bound_faults({c.case: c for c in (NONE, BOUND, chosen)})
    assert [f["above"] for f in faults] == ["op-tp2-ub.a"]


def test_a_setting_slower_than_none_hides_nothing_never_below_zero():
    worse = pt("op-tp2-ub.a", [10.1, 10.25, 10.0, 10.2, 10.1, 10.1])
    e = efficiency.op_efficiency(NONE, worse, BOUND)
    assert e.raw < 0 and e.value == 0.0 and e.capped == "at none"


def test_median_efficiency_is_capped_and_gives_no_figure_below_its_bound():
    """By medians (a bound estimated from other sessions): the same definition, never above 100% nor below 0."""
    e = efficiency.median_efficiency(10.0, 9.0, 8.0)
    assert e.value == pytest.approx(0.5) and e.lo is None and e.shown() == "50%"
    slower = efficiency.median_efficiency(10.0, 11.0, 8.0)
    assert slower.value == 0.0 and slower.raw == pytest.approx(-0.5) and slower.shown() == "0%, at none"
    below = efficiency.median_efficiency(10.0, 7.0, 8.0)
    assert below.value is None and below.raw == pytest.approx(1.5) and "%" not in below.shown()
    assert efficiency.median_efficiency(10.0, 9.0, 10.5).value is None


def test_model_efficiency_sums_the_ops_each_capped_at_its_bound():
    half = pt("a-tp2-ub.x", [n - 0.5 * (n - b) for n, b in zip(point_rounds(NONE).values(),
                                                               point_rounds(BOUND).values())])
    over = pt("a-tp2-ub.y", [8.9, 9.2, 9.0, 9.0, 8.9, 9.1])        # capped: hides exactly its exposed time
    m = efficiency.model_efficiency({"a": (NONE, half, BOUND), "b": (NONE, over, BOUND)})
    assert m.value == pytest.approx(0.75, abs=1e-9) and m.ops == ["a", "b"]
    uncapped = (sum(n - c for n, c in zip(point_rounds(NONE).values(), point_rounds(over).values())) / 6)
    assert uncapped > sum(n - b for n, b in zip(point_rounds(NONE).values(), point_rounds(BOUND).values())) / 6
    faulty = pt("a-tp2-ub.z", [8.6, 8.7, 8.55, 8.65, 8.6, 8.62])
    m = efficiency.model_efficiency({"a": (NONE, half, BOUND), "c": (NONE, faulty, BOUND)})
    assert m.ops == ["a"] and m.left_out == [{"op": "c", "why": "bound fault"}]


def test_pooling_takes_each_session_as_a_block():
    a1, b1 = {i: 1.0 * x for i, x in enumerate([100, 101, 99, 100])}, {i: 100.0 for i in range(4)}
    a2, b2 = {i: 1.05 * x for i, x in enumerate([100, 101, 99, 100])}, {i: 100.0 for i in range(4)}
    one = pooled.pooled_ratio([("s1", a1, b1)])
    assert one.ratio == pytest.approx(paired_ratio(a1, b1).ratio) and one.rounds == 4
    p = pooled.pooled_ratio([("s1", a1, b1), ("s2", a2, b2)])
    assert p.rounds == 8 and len(p.sessions) == 2
    # the sessions' levels (1.00 vs 1.05) are blocks: the interval is the within-session spread's, and the
    # disagreement between sessions is said, not hidden in the interval
    assert p.ratio == pytest.approx(math.sqrt(1.05), rel=2e-3) and p.heterogeneous
    assert (math.log(p.hi) - math.log(p.lo)) < 0.02


def test_pooled_block_figure_of_the_knobs_run_on_its_recorded_sessions():
    spec = json.loads((KNOBS / "pooled_with.json").read_text())
    from tptune.records.sessions import load_session

    blocks = pooled.session_blocks(
        [("rep1", load_session(KNOBS / "sessions/layer/tp2"), "layer-tp2-ub.tuned_tp2", "layer-tp2-ub.nvidia_bf16_tp2")] +
        [(o["session"], load_session(KNOBS / o["session"]), o["tuned"], "layer-tp2-ub.nvidia_bf16_tp2") for o in spec])
    first = pooled.pooled_ratio(blocks[:4])   # the run, its repeat and two verify sessions on its lease
    assert first.rounds == 22 and len(first.sessions) == 4
    assert (round(first.ratio, 3), round(first.lo, 3), round(first.hi, 3)) == (0.977, 0.974, 0.980)
    assert wording.classify(first.lo, first.hi, 0.02) == wording.FASTER_WITHIN     # clears 1, not the margin
    # and two more verify sessions on another lease (recipe-env-h200x2), and rs-dgrad-x2's experiment, which
    # measured the same settings (records.block_sessions: the same pair, found by its settings)
    p = pooled.pooled_ratio(blocks)
    assert p.rounds == 36 and len(p.sessions) == 7
    assert (round(p.ratio, 3), round(p.lo, 3), round(p.hi, 3)) == (0.977, 0.975, 0.979)
    assert wording.classify(p.lo, p.hi, 0.02) == wording.FASTER_BEYOND      # 36 rounds clear the margin, narrowly
    rep1 = p.sessions[0]
    assert rep1["rounds"] == 4 and wording.classify(rep1["lo"], rep1["hi"], 0.02) == wording.FASTER_BEYOND


def test_wording_distinguishes_significant_within_margin_from_a_tie():
    assert wording.classify(1.002, 1.017, 0.02) == wording.SLOWER_WITHIN     # FP8 delayed block vs preset
    assert wording.classify(0.995, 1.01, 0.02) == wording.TIE
    assert wording.classify(0.97, 1.01, 0.02) == wording.UNDECIDED
    assert wording.classify(0.966, 0.978, 0.02) == wording.FASTER_BEYOND


def test_bound_burn_in_drops_its_first_round_and_keeps_the_rest():
    b = pt("op-tp2-nocomm", [9.9, 9.0, 9.1, 9.05])
    out = bound.burned_in(b)
    assert point_rounds(out) == {1: 9.0, 2: 9.1, 3: 9.05} and out.burn_in["dropped_rounds"] == [0]
    assert point_rounds(b)[0] == 9.9                                   # the recorded point is untouched
    assert bound.burned_in(pt("op-tp2-nocomm", [9.9, 9.0])) is not None


def _point_session(run, op):
    d = RESULTS / run / "sessions" / op / "tp2" / "point"
    s = json.loads((d / "session.json").read_text())
    return {c: read_point(d / p) for c, p in s["runs"].items()}


def test_recorded_bound_reads_above_fewer_settings_after_its_burn_in():
    before = after = 0
    for op in ("qkv", "proj", "fc1", "fc2"):
        runs = _point_session("knobs-llama3-70b-x2", op)
        b = next(p for c, p in runs.items() if bound.is_bound(c))
        for c, p in runs.items():
            if c != b.case:
                before += bound.bound_above_rounds(b, p)[0]
                after += bound.bound_above_rounds(bound.burned_in(b), p)[0]
    assert after < before


def test_finalists_are_faster_than_the_pick_beyond_the_noise_within_the_margin():
    pick = pt("op-tp2-none", [10.0, 10.2, 9.9, 10.1])
    fin = pt("op-tp2-ub.a", [9.8, 10.0, 9.7, 9.9])                      # 2% faster every round, interval < 1
    noisy = pt("op-tp2-ub.b", [9.5, 10.4, 9.6, 10.3])
    out = finalists.finalists(pick, [pick, fin, noisy])
    assert [f["case"] for f in out] == ["op-tp2-ub.a"] and out[0]["hi"] < 1


def test_recorded_stability_session_keeps_significant_gains_as_finalists():
    from tptune.stats.pick import pick_best

    runs = {c: p.slim() for c, p in _point_session("stability-llama3-70b-x2-v2/rep1", "fc1").items()}
    cands = [p for c, p in runs.items() if not bound.is_bound(c)]
    pick, _ = pick_best(cands, 0.02)
    out = finalists.finalists(pick, cands)
    assert pick.case == "fc1-tp2-none" and len(out) == 2     # a tie-break gave no overlap, 1.6% slower
    for f in out:
        r = paired_ratio(point_rounds(runs[f["case"]]), point_rounds(pick))
        assert r.hi < 1 and r.hi > 1 - 0.02                         # beyond the noise, within the margin


def test_the_block_decides_between_the_tuned_and_the_finalists_combination(tmp_path):
    import statistics
    import types

    from tptune.decide.layer import layer_record
    from tptune.records.sessions import load_session

    from tptune.model.spec import load_model

    tiny = load_model(Path(__file__).parents[2] / "config" / "models" / "tiny.yaml",
                      {"seq_length": 512, "micro_batch_size": 1, "dtype": "fp32"})
    s = types.SimpleNamespace(decision=Decision.from_dict({"noise_floor": 0.02}),
                              layer=Layer.from_dict({"num_layers": 2}), model=tiny)

    def session(d, members):
        runs = {}
        for cid, rounds in members.items():
            m = d / "sessions" / "layer" / "tp2" / cid.split("-", 2)[2]
            m.mkdir(parents=True)
            (m / "run.json").write_text(json.dumps({
                "case": cid, "status": "ok", "session": "layer/tp2", "correctness": {"ok": True},
                "timing": {"total_ms": {"median": statistics.median(rounds), "rounds": rounds,
                                        "round_ids": list(range(len(rounds)))}}, "host": {"host_ms": 10.0}}))
            runs[cid] = f"{m.name}/run.json"
        (d / "sessions" / "layer" / "tp2" / "session.json").write_text(
            json.dumps({"session": "layer/tp2", "runs": runs, "rounds": 4, "stop": "x"}))
        return load_session(d / "sessions" / "layer" / "tp2")

    tuned, fast, none = "layer-tp2-ub.tuned_tp2", "layer-tp2-ub.fastest_tp2", "layer-tp2-none"
    drift = [1.0, 1.01, 0.99, 1.0]
    rec = layer_record(s, 2, session(tmp_path / "a", {none: [81 * x for x in drift], tuned: [78 * x for x in drift],
                                                      fast: [77.2 * x for x in drift]}), tuned)
    assert rec["winner"] == fast          # 1% faster in every round: beyond the noise, within the margin
    rec = layer_record(s, 2, session(tmp_path / "b", {none: [81 * x for x in drift], tuned: [78 * x for x in drift],
                                                      fast: [77.2, 78.8, 76.9, 78.9]}), tuned)
    assert rec["winner"] == tuned         # rounds that scatter either side of the tuned ones: tuned stays


def test_block_batch_evidence_is_recorded_like_an_op_batch():
    ranks = [{"host_agreed_ms": 13.0, "gpu_probe_ms": 80.0, "attempts": [
        {"entered_ms": 150.0, "slept_ms": 180.0, "enqueue_ms": 700.0, "idle_marks": 0}]},
        {"host_agreed_ms": 13.0, "gpu_probe_ms": 81.0, "attempts": [
        {"entered_ms": 160.0, "slept_ms": 178.0, "enqueue_ms": 710.0, "idle_marks": 0}]}]
    ev = host.evidence(ranks)
    assert ev == {"host_probe_ms": 13.0, "gpu_probe_ms": 81.0, "entered_ms": 160.0, "enqueue_ms": 710.0,
                  "idle_marks": 0, "slept_ms": 178.0, "gpu_idle_seen": False}
    batch = {"timing": "gpu_host_ahead", "check": "queue", "host_ahead": True, "evidence": ev}
    assert host.complete(batch) and not host.complete({**batch, "evidence": None})


def test_launch_keeps_the_evidence_of_each_round():
    from tptune.measure.launch import _round_point

    res = {"reply": {"ranks": [{"rank": r, "samples": {"fwd_ms": [1.0], "bwd_ms": [2.0], "total_ms": [3.0]},
                                "batch": {"timing": "gpu_host_ahead", "host_ms": 1.0, "host_ahead": True,
                                          "host_agreed_ms": 1.0, "gpu_probe_ms": 3.0,
                                          "attempts": [{"check": "queue", "entered_ms": 5.0, "slept_ms": 9.0,
                                                        "enqueue_ms": 30.0, "idle_marks": 0}]}}
                               for r in (0, 1)]}}
    p = MeasuredPoint.from_dict(_round_point("layer-tp2-none", "layer/tp2", [(0, res)]))
    assert host.complete(p.host_batches[0]) and host.summary(p)["unproven"] == 0


def test_recorded_block_sessions_count_failed_and_unproven_batches():
    d = RESULTS / "verify-llama3-70b-x2" / "sessions" / "layer" / "tp2"
    s = json.loads((d / "session.json").read_text())
    for p in s["runs"].values():
        h = host.summary(read_point(d / p))
        assert h["batches"] > 0 and h["failed"] == h["batches"]          # every block batch fell behind
    k = KNOBS / "sessions" / "layer" / "tp2" / "ub.tuned_tp2" / "run.json"
    h = host.summary(read_point(k))
    assert h["failed"] == 0 and h["unproven"] == h["batches"] == 6     # queue verdicts without their figures

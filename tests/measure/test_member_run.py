"""launch: a member's point and run.json from fake worker replies (host-ahead bookkeeping), the session
loop on a fake measurement; worker.timing.wall_batch on a fake bench."""
import json
import math
import statistics
import time
from pathlib import Path

import pytest

from tptune.cases import parse_case_id
from tptune.measure.gpupool import GpuPool
from tptune.measure.launch import Launcher, _failure, _round_point, assemble_member_run
from tptune.settings.blocks import LauncherSettings
from tptune.measure.session_spec import SessionSpec
from tptune.model.spec import load_model

ROOT = Path(__file__).resolve().parents[2]
SESSION = "qkv/tp2/point"


def rank(r, total, fwd=None, bwd=None, host_ms=1.0, ahead=True, attempts=None, trace=None,
         init_s=0.1, measure_s=0.2, total_s=0.3, correctness=None):
    fwd = fwd if fwd is not None else [t * 0.4 for t in total]
    bwd = bwd if bwd is not None else [t * 0.6 for t in total]
    return {"rank": r, "samples": {"fwd_ms": fwd, "bwd_ms": bwd, "total_ms": total},
            "batch": {"host_ms": host_ms, "host_ahead": ahead,
                      "attempts": attempts or [{"slept_ms": 5.0, "enqueue_ms": 2.0}],
                      "timing": "gpu_host_ahead"},
            "trace": trace, "correctness": correctness, "init_s": init_s, "measure_s": measure_s,
            "total_s": total_s}


def ok(ranks, startup=None, env=None, started=False):
    reply = {"ranks": ranks, "environment": env or {}, "startup": startup, "served_before": 0}
    return {"status": "ok", "reply": reply, "gpus": ["0", "1"], "server_started": started}


def three_rounds():
    """Rounds 0, 2, 5 of a member; ranks listed out of order on purpose."""
    r0 = ok([rank(1, [2.0, 4.0, 6.0], fwd=[0.8, 1.5, 2.5], host_ms=3.0,
                  attempts=[{"slept_ms": 4.0, "enqueue_ms": 5.0}, {"slept_ms": 9.0, "enqueue_ms": 5.5}],
                  trace="trace.rank1.json.gz", init_s=0.4, measure_s=0.5, total_s=1.0),
             rank(0, [1.0, 5.0, 3.0], fwd=[0.4, 2.0, 1.0], host_ms=1.0, trace="trace.rank0.json.gz",
                  correctness={"ok": True}, init_s=0.2, measure_s=0.3, total_s=0.9)],
            env={"torch": "x"}, started=True)
    r1 = ok([rank(0, [4.0, 4.0, 4.0], host_ms=2.0), rank(1, [3.0, 3.0, 9.0], host_ms=2.5, ahead=False)],
            startup={"import_s": 1.5})
    r2 = ok([rank(0, [7.0, 7.0, 7.0], host_ms=9.0, measure_s=0.7), rank(1, [6.0, 8.0, 6.0], host_ms=1.0)])
    return [(0, r0), (2, r1), (5, r2)]


# -- _round_point ------------------------------------------------------------------------------------

def test_round_point_slowest_rank_and_round_medians():
    p = _round_point("qkv-tp2-ub.te", SESSION, three_rounds())
    assert p["case"] == "qkv-tp2-ub.te" and p["status"] == "ok" and p["session"] == SESSION
    t = p["timing"]["total_ms"]
    # slowest rank per iteration: [2,5,6], [4,4,9], [7,8,7]
    assert t["samples"] == [2.0, 5.0, 6.0, 4.0, 4.0, 9.0, 7.0, 8.0, 7.0]
    assert t["rounds"] == [5.0, 4.0, 7.0] and t["round_ids"] == [0, 2, 5]
    assert t["median"] == 5.0                    # median of the round medians
    assert t["iter_median"] == 6.0               # median of all 9 iterations
    assert t["n"] == 9 and t["max"] == 9.0 and t["min"] == 2.0
    f = p["timing"]["fwd_ms"]
    assert f["samples"][:3] == [0.8, 2.0, 2.5]   # element-wise max, per key
    assert f["rounds"][0] == 2.0


def test_round_point_host_bookkeeping():
    p = _round_point("qkv-tp2-ub.te", SESSION, three_rounds())
    h = p["host"]
    assert h["host_ms"] == 3.0                   # median over rounds of max over ranks: (3, 2.5, 9)
    assert h["gpu_ms"] == 5.0 and h["host_bound"] is False
    assert h["host_ahead"] is False              # rank 1 fell behind in round 2
    b = h["batches"]
    assert [x["round"] for x in b] == [0, 2, 5]
    assert [x["host_ms"] for x in b] == [3.0, 2.5, 9.0]
    assert [x["host_ahead"] for x in b] == [True, False, True]
    assert b[0]["attempts"] == 2 and b[0]["slept_ms"] == 9.0 and b[0]["enqueue_ms"] == 5.5
    assert b[1]["attempts"] == 1 and b[1]["timing"] == "gpu_host_ahead"


def test_round_point_host_bound_and_ahead():
    rounds = [(0, ok([rank(0, [1.0, 1.0, 1.0], host_ms=1.5), rank(1, [1.0, 1.0, 1.0], host_ms=0.5)]))]
    p = _round_point("c", "s", rounds)
    assert p["host"]["host_ms"] == 1.5 and p["host"]["host_bound"] is True and p["host"]["host_ahead"] is True
    eq = _round_point("c", "s", [(0, ok([rank(0, [2.0, 2.0], host_ms=2.0), rank(1, [2.0, 2.0], host_ms=1.0)]))])
    assert eq["host"]["host_bound"] is True      # host >= GPU
    below = _round_point("c", "s", [(0, ok([rank(0, [2.0, 2.0], host_ms=1.99)]))])
    assert below["host"]["host_bound"] is False


def test_round_point_wall_batches_without_host_ahead_flag():
    """CPU wall batches carry no host_ahead: they count as ahead."""
    r = ok([rank(0, [2.0, 2.0]), rank(1, [2.0, 2.0])])
    for x in r["reply"]["ranks"]:
        x["batch"] = {"host_ms": 2.2, "timing": "wall"}
    p = _round_point("c", "s", [(3, r)])
    assert p["host"]["host_ahead"] is True and p["host"]["batches"][0]["attempts"] == 0
    assert p["timing"]["total_ms"]["round_ids"] == [3]


# -- assemble_member_run ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mc():
    return load_model(ROOT / "config" / "models" / "tiny.yaml")


CASE = parse_case_id("qkv-tp2-ub.te")
RUN_SETTINGS = {"backend": "torch", "device": "cpu"}
SETTINGS = {"backend": "torch", "timing": {"iters": 3}, "check": True, "profile": True, "fault": "x", "te": {}}
ATTEMPTS = [{"status": "ok", "held_s": 0.5, "server_started": True}, {"status": "ok", "held_s": 0.25},
            {"status": "ok", "held_s": 0.25, "server_started": False}]


def test_member_run_from_rounds(mc):
    run = assemble_member_run(CASE, mc, RUN_SETTINGS, SETTINGS, three_rounds(), None, ATTEMPTS, SESSION)
    assert run["status"] == "ok" and run["error"] is None
    assert (run["case"], run["op"], run["tp"], run["variant"]) == ("qkv-tp2-ub.te", "qkv", 2, "ub.te")
    assert run["session"] == SESSION and run["backend"] == "torch" and run["device"] == "cpu"
    assert run["settings"] == {"backend": "torch", "timing": {"iters": 3}, "check": True, "te": {}}
    assert run["model"] == mc.to_dict()
    assert run["wall_s"] == pytest.approx(1.0)
    t = run["timing"]["total_ms"]
    assert t["rounds"] == [5.0, 4.0, 7.0] and t["round_ids"] == [0, 2, 5] and t["median"] == 5.0
    assert run["timing"]["per_rank_median_total_ms"] == [3.0, 4.0]     # first round, rank order
    assert run["host"]["host_ahead"] is False and run["host"]["host_ms"] == 3.0
    assert run["traces"] == ["trace.rank0.json.gz", "trace.rank1.json.gz"]
    assert run["correctness"] == {"ok": True} and run["environment"] == {"torch": "x"}
    la = run["launch"]
    assert la["gpus"] == ["0", "1"] and la["server_started"] is True
    assert la["startup"] == {"import_s": 1.5}
    assert la["init_s"] == pytest.approx(0.4 + 0.1 + 0.1)
    assert la["measure_s"] == pytest.approx(0.5 + 0.2 + 0.7)
    assert la["case_s"] == pytest.approx(1.0 + 0.3 + 0.3)
    assert la["rounds"] == 3 and la["held_s"] == pytest.approx(1.0)
    json.dumps(run)                               # run.json must serialise
    from tptune.records.measured_point import MeasuredPoint
    from tptune.trace.session_tables import round_costs
    costs = round_costs(MeasuredPoint.from_dict(run))   # each timed iteration at its slowest rank; each round's longest hold
    assert costs["timed_s"] == pytest.approx((2 + 5 + 6 + 4 + 4 + 9 + 7 + 8 + 7) / 1e3)
    assert costs["hold_s"] == pytest.approx((9.0 + 5.0 + 5.0) / 1e3)
    assert (costs["init_s"], costs["measure_s"], costs["close_s"]) == (la["init_s"], la["measure_s"], la["close_s"])
    assert round_costs(MeasuredPoint("qkv-tp2-ub.te", "failed")) == dict.fromkeys(costs)


def test_member_failed_in_a_later_round_keeps_its_rounds(mc):
    fail = _failure("comm", True, "NCCL error: unhandled system error", ["0", "1"], False)
    run = assemble_member_run(CASE, mc, RUN_SETTINGS, SETTINGS, three_rounds()[:2], fail, ATTEMPTS, SESSION)
    assert run["status"] == "ok"
    assert run["error"]["kind"] == "comm" and run["error"]["after_rounds"] == 2
    assert run["error"]["message"].startswith("NCCL error")
    assert run["timing"]["total_ms"]["rounds"] == [5.0, 4.0] and run["timing"]["total_ms"]["round_ids"] == [0, 2]
    assert run["launch"]["rounds"] == 2
    assert "after_rounds" not in fail["error"]      # the attempt's own record is not changed


def test_member_failed_in_its_first_round(mc):
    fail = _failure("oom", False, "CUDA out of memory", ["0", "1"], True)
    run = assemble_member_run(CASE, mc, RUN_SETTINGS, SETTINGS, [], fail, ATTEMPTS[:1], SESSION)
    assert run["status"] == "failed" and run["error"]["kind"] == "oom" and "after_rounds" not in run["error"]
    assert "timing" not in run and "launch" not in run and run["wall_s"] == 0.5


def test_member_never_measured(mc):
    run = assemble_member_run(CASE, mc, RUN_SETTINGS, SETTINGS, [], None, [], SESSION)
    assert run["status"] == "failed" and run["error"]["message"] == "never measured"
    assert run["wall_s"] == 0


# -- the session loop on a fake measurement ----------------------------------------------------------

NONE, A, B, C, D = ("qkv-tp2-none", "qkv-tp2-ub.te", "qkv-tp2-ub.te+dgrad.bulk.sm4",
                    "qkv-tp2-ub.te+dgrad.bulk.sm8", "qkv-tp2-ub.te+fprop.ring")
BASE_MS = {NONE: 14.0, A: 10.0, B: 12.0, C: 10.05, D: 10.0}
DRIFT = [1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 0.97]


def fake_launcher(tmp_path, fail_at=None):
    lz = object.__new__(Launcher)
    lz.backend = "torch"
    lz.lc = LauncherSettings.from_dict({"retries": 0})
    lz.device = "cpu"
    lz.pool_dir = tmp_path / "pool"
    lz.pool = GpuPool(lz.pool_dir / "locks", ["0", "1"])
    lz.sig = "test"
    calls, log = {}, []
    fail_at = fail_at or {}

    def measure_once(case, mc, out_dir, settings, gpus, attempts):
        Path(out_dir).mkdir(parents=True, exist_ok=True)   # as the real _measure_once does
        k = calls[str(out_dir)] = calls.get(str(out_dir), -1) + 1
        log.append((case.id, Path(out_dir).name, settings["profile"], settings["check"]))
        if fail_at.get(case.id) == k:
            res = _failure("exception", False, "boom", gpus, False)
        else:
            wob = 0.015 if (case.id == C and k % 2) else (-0.015 if case.id == C else 0.0)
            ms = BASE_MS[case.id] * DRIFT[k] * math.exp(wob)
            res = ok([rank(0, [ms] * 3, host_ms=1.0), rank(1, [ms * 0.99] * 3, host_ms=1.2)],
                     started=not log[:-1])
            res["gpus"] = gpus
        res["held_s"] = 0.01
        attempts.append({k2: v for k2, v in res.items() if k2 != "reply"})
        return res

    lz._measure_once = measure_once
    return lz, log


def test_session_adapts_rounds_drops_losers_and_records(tmp_path, mc):
    lz, log = fake_launcher(tmp_path, fail_at={D: 1})
    members = [parse_case_id(c) for c in (NONE, A, B, C, D)]
    sdir = tmp_path / "sessions" / "qkv" / "tp2" / "point"
    rec = lz.session(SessionSpec(SESSION, members, mc, {"timing": {"min_rounds": 3, "max_rounds": 6, "lead_in": True},
                                                        "check": True},
                                 contenders=[A, B, C], canary=parse_case_id(NONE), margin=0.02), sdir)
    assert rec["order"][0] == [NONE, A, B, C, D]
    assert rec["order"][1] == [A, B, C, D, NONE]
    assert rec["order"][2] == [B, C, NONE, A]            # D failed in round 1: gone from round 2
    # after min_rounds: the leader, the unresolved and the reference (no overlap, beaten by far) only
    assert [sorted(o) for o in rec["order"][3:]] == [sorted([A, C, NONE])] * 3
    assert rec["order"][3] == [NONE, A, C]                # still rotating
    assert rec["rounds"] == 6 and rec["leader"] == A
    assert rec["stop"] == f"round budget (6) spent; undecided: {C}"
    assert rec["failed"] == [D]
    assert rec["ratios_to_leader"][B]["ratio"] == pytest.approx(1.2, abs=1e-4)
    assert rec["ratios_to_leader"][B]["rounds"] == 3
    assert rec["canary"]["case"] == NONE and rec["canary"]["ms"] == pytest.approx(14.0)
    assert rec["canary"]["host_ahead"] is True
    assert rec["group_starts"] == 1
    assert json.loads((sdir / "session.json").read_text())["stop"] == rec["stop"]
    # the canary, then the lead-in (the first member once, untimed, outside the rounds), then round 0
    assert [(cid, d) for cid, d, _, _ in log[:3]] == [(NONE, "canary"), (NONE, "lead_in"), (NONE, "none")]
    assert rec["lead_in"]["case"] == NONE and rec["lead_in"]["ms"] == pytest.approx(14.0)
    # evidence (profile + check) only in each member's first round; never for the canary or the lead-in
    firsts = {}
    for cid, d, prof, chk in log:
        if d in ("canary", "lead_in"):
            assert not prof and not chk
            continue
        assert prof == chk == (cid not in firsts)
        firsts[cid] = True
    runs = {c: json.loads((sdir / p).read_text()) for c, p in rec["runs"].items()}
    assert len(runs[A]["timing"]["total_ms"]["rounds"]) == 6
    assert runs[B]["timing"]["total_ms"]["round_ids"] == [0, 1, 2]
    assert runs[NONE]["timing"]["total_ms"]["round_ids"] == list(range(6))
    assert runs[D]["status"] == "ok" and runs[D]["error"]["after_rounds"] == 1
    assert runs[D]["timing"]["total_ms"]["round_ids"] == [0]
    assert all(r["session"] == SESSION for r in runs.values())


def test_session_stops_at_min_rounds_once_resolved(tmp_path, mc):
    lz, _ = fake_launcher(tmp_path)
    members = [parse_case_id(c) for c in (A, B)]
    rec = lz.session(SessionSpec("s", members, mc, {"timing": {"min_rounds": 3, "max_rounds": 8}}, margin=0.02),
                     tmp_path / "s")
    assert rec["rounds"] == 3 and rec["stop"] == "resolved after 3 rounds"
    assert rec["leader"] == A and rec["canary"] is None and rec["failed"] == []
    assert rec["lead_in"] is None                      # off by default


def test_lead_in_when_asked_runs_the_first_member_once_outside_the_rounds(tmp_path, mc):
    lz, log = fake_launcher(tmp_path)
    members = [parse_case_id(c) for c in (A, B)]
    rec = lz.session(SessionSpec("s", members, mc, {"timing": {"min_rounds": 3, "max_rounds": 8, "lead_in": True}},
                                 margin=0.02), tmp_path / "s")
    assert [(cid, d) for cid, d, _, _ in log[:2]] == [(A, "lead_in"), (A, A.split("-", 2)[2])]
    assert rec["lead_in"]["case"] == A and rec["rounds"] == 3
    assert sum(d == "lead_in" for _, d, _, _ in log) == 1


# -- wall_batch ------------------------------------------------------------------------------------

class SleepyBench:
    def __init__(self):
        self.calls = []

    def forward(self):
        self.calls.append("f")
        time.sleep(0.002)

    def backward(self):
        self.calls.append("b")
        time.sleep(0.003)

    def zero_grad(self):
        self.calls.append("z")
        time.sleep(0.001)


def test_wall_batch_on_a_fake_bench():
    from tptune.measure.worker.timing import wall_batch

    bench = SleepyBench()
    out = wall_batch(bench, 4)
    assert bench.calls == ["f", "b", "z"] * 4
    s = out["samples"]
    assert len(s["fwd_ms"]) == len(s["bwd_ms"]) == len(s["total_ms"]) == 4
    assert all(f >= 2.0 for f in s["fwd_ms"]) and all(b >= 3.0 for b in s["bwd_ms"])
    assert s["total_ms"] == [f + b for f, b in zip(s["fwd_ms"], s["bwd_ms"])]
    assert out["timing"] == "wall"
    # the host's time per iteration includes zero_grad: at least fwd + bwd + 1 ms on average
    assert out["host_ms"] >= statistics.fmean(s["total_ms"]) + 1.0 - 1e-6
    assert out["host_ms"] > 0


def test_dropped_setting_never_leads_and_always_members_stay(tmp_path, mc):
    """As in the x2 layer session: two tied fastest settings; the one dropped as a tie after min_rounds
    kept a lower median on its 2 rounds and became the leader of the rest, which then could never be
    resolved against it. The leader is chosen among the settings still measured; ``always`` stays."""
    lz, log = fake_launcher(tmp_path)
    base = {A: 10.0, D: 10.0, B: 10.7, C: 10.7}
    jitter = {A: [0.999, 1.0, 1.004, 1.004, 1.004, 1.004], D: [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}
    seen = {}

    def measure_once(case, mc_, out_dir, settings, gpus, attempts):
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        k = seen[str(out_dir)] = seen.get(str(out_dir), -1) + 1
        ms = base[case.id] * jitter.get(case.id, [1.0, 1.01, 0.99, 1.02, 0.98, 1.0])[k]
        res = ok([rank(0, [ms] * 3, host_ms=1.0), rank(1, [ms] * 3, host_ms=1.0)], started=k == 0)
        res.update(gpus=gpus, held_s=0.01)
        attempts.append({k2: v for k2, v in res.items() if k2 != "reply"})
        return res

    lz._measure_once = measure_once
    members = [parse_case_id(c) for c in (A, D, B, C)]
    rec = lz.session(SessionSpec("s", members, mc, {"timing": {"min_rounds": 2, "max_rounds": 6}}, margin=0.02),
                     tmp_path / "s")
    measured_last = set(rec["order"][-1])
    assert rec["leader"] in measured_last          # the leader is one of the settings still measured
    assert rec["rounds"] < 6                       # so the others resolve against it
    rec2 = lz.session(SessionSpec("s2", members, mc, {"timing": {"min_rounds": 2, "max_rounds": 4}}, margin=0.02,
                                  always=[D]), tmp_path / "s2")
    assert all(D in o for o in rec2["order"])


def test_futile_comparison_stops_the_session_early(tmp_path, mc):
    """B reads 1.5% slower than A with +-0.8% from round to round: at the 2% floor the 6-round budget
    could not clear it (nor lay it inside the tie band), so from round 3 on it gets no more rounds;
    with timing.futility off the session runs to the budget and ends in the same undecided tie."""
    wobble = [1.0, 1.008, 0.992, 1.0, 1.008, 0.992]

    def run(futility, sub):
        lz, _ = fake_launcher(tmp_path / sub)
        seen = {}

        def measure_once(case, mc_, out_dir, settings, gpus, attempts):
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            k = seen[str(out_dir)] = seen.get(str(out_dir), -1) + 1
            ms = 10.0 * (1.015 * wobble[k] if case.id == B else 1.0) * DRIFT[k]
            res = ok([rank(0, [ms] * 3, host_ms=1.0), rank(1, [ms] * 3, host_ms=1.0)], started=k == 0)
            res.update(gpus=gpus, held_s=0.01)
            attempts.append({k2: v for k2, v in res.items() if k2 != "reply"})
            return res

        lz._measure_once = measure_once
        members = [parse_case_id(c) for c in (NONE, A, B)]
        return lz.session(SessionSpec("s", members, mc, {"timing": {"min_rounds": 2, "max_rounds": 6,
                                                                     "futility": futility}},
                                      contenders=[A, B], margin=0.02), tmp_path / sub / "s")

    early, full = run(True, "on"), run(False, "off")
    assert early["futility"] is True and full["futility"] is False
    assert early["rounds"] == 3 and early["futile"] == [B]
    assert early["stop"] == f"futile after 3 rounds (the budget of 6 could not clear them either); undecided: {B}"
    assert full["rounds"] == 6 and full["futile"] == [] and full["stop"] == f"round budget (6) spent; undecided: {B}"
    for rec in (early, full):
        r = rec["ratios_to_leader"][B]
        assert rec["leader"] == A and r["lo"] < 1.02 < r["hi"]      # straddles the margin: undecided


def test_a_member_whose_host_fell_behind_after_every_attempt_gets_one_attempt_next_round(tmp_path, mc):
    """A host-bound member (every attempt's batch behind: Qwen3-30B-A3B's MoE block on 2x H100) is not
    retried with ever longer sleeps in every round: its next batch gets one attempt; a batch that gets
    the host ahead gives the member the worker's full count back. Others are untouched."""
    lz, _ = fake_launcher(tmp_path)
    seen = {}
    behind_rounds = {B: {0, 1}}          # B's host falls behind in its rounds 0 and 1, then gets ahead

    def measure_once(case, mc_, out_dir, settings, gpus, attempts):
        k = len(seen.setdefault(case.id, []))
        seen[case.id].append(settings["timing"].get("host_attempts"))
        ahead = k not in behind_rounds.get(case.id, set())
        ms = BASE_MS[case.id]
        res = ok([rank(0, [ms] * 3, ahead=ahead), rank(1, [ms] * 3)])
        res["held_s"] = 0.01
        attempts.append({k2: v for k2, v in res.items() if k2 != "reply"})
        return res

    lz._measure_once = measure_once
    members = [parse_case_id(c) for c in (A, B)]
    rec = lz.session(SessionSpec("s", members, mc, {"timing": {"min_rounds": 4, "max_rounds": 4}}, margin=0.02),
                     tmp_path / "s")
    assert rec["rounds"] == 4
    assert seen[A] == [None] * 4
    assert seen[B] == [None, 1, 1, None]   # behind in round 0 -> one attempt; ahead in round 2 -> full again
    run_b = json.loads((tmp_path / "s" / rec["runs"][B]).read_text())
    assert [b["host_ahead"] for b in run_b["host"]["batches"]] == [False, False, True, True]


def test_an_interrupted_session_resumes_from_its_completed_rounds(tmp_path, mc):
    """A session stopped mid-round (a timeout's SIGINT) keeps its completed rounds in session.partial.json;
    the same session run again goes on from the next round with those rounds, and ends as one session
    (session.json says how many rounds it resumed after; the partial record is gone). A partial record of
    other settings is not resumed from."""
    members = [parse_case_id(c) for c in (NONE, A, B)]
    sdir = tmp_path / "s"

    def spec(max_rounds=5):
        return SessionSpec("s", members, mc, {"timing": {"min_rounds": 5, "max_rounds": max_rounds}}, margin=0.02)

    lz, log = fake_launcher(tmp_path)
    real = lz._measure_once

    def interrupted(case, mc_, out_dir, settings, gpus, attempts):
        if len(log) == 7:          # round 2's second member: rounds 0 and 1 are complete
            raise KeyboardInterrupt
        return real(case, mc_, out_dir, settings, gpus, attempts)

    lz._measure_once = interrupted
    with pytest.raises(KeyboardInterrupt):
        lz.session(spec(), sdir)
    partial = json.loads((sdir / "session.partial.json").read_text())
    assert partial["order"] == [[NONE, A, B], [A, B, NONE]] and not (sdir / "session.json").exists()

    lz2, log2 = fake_launcher(tmp_path)
    rec = lz2.session(spec(), sdir)
    assert rec["resumed_after_rounds"] == 2 and rec["rounds"] == 5
    assert rec["order"][:2] == partial["order"] and rec["order"][2] == [B, NONE, A]   # the rotation goes on
    assert len(log2) == 3 * 3                                                     # rounds 2, 3, 4 only
    run_a = json.loads((sdir / rec["runs"][A]).read_text())
    assert run_a["timing"]["total_ms"]["round_ids"] == [0, 1, 2, 3, 4]
    assert not (sdir / "session.partial.json").exists()

    # an interrupted run of other settings: its rounds are not this session's
    sdir2 = tmp_path / "s2"
    lz4, _ = fake_launcher(tmp_path)
    real4 = lz4._measure_once
    calls = []

    def stop_in_round_1(case, mc_, out_dir, settings, gpus, attempts):
        calls.append(case.id)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real4(case, mc_, out_dir, settings, gpus, attempts)

    lz4._measure_once = stop_in_round_1
    with pytest.raises(KeyboardInterrupt):
        lz4.session(spec(max_rounds=5), sdir2)
    assert (sdir2 / "session.partial.json").exists()
    lz5, log5 = fake_launcher(tmp_path)
    other = SessionSpec("s", members, mc, {"timing": {"min_rounds": 3, "max_rounds": 3}}, margin=0.02)
    rec5 = lz5.session(other, sdir2)
    assert rec5["resumed_after_rounds"] == 0 and rec5["rounds"] == 3 and len(log5) == 9

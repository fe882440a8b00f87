"""layer.layer_record on recorded block sessions: the block-level winner must pass the numerics check."""
import json
import statistics
import types

from tptune.layer import layer_record

DRIFT = [1.0, 1.01, 0.99, 1.0]
TUNED, NEMO, NONE = "layer-tp2-ub.tuned_tp2", "layer-tp2-ub.nemo_tp4", "layer-tp2-none"
S = types.SimpleNamespace(config={"decision": {"noise_floor": 0.02}, "layer": {"num_layers": 2}})


def _session(run_dir, members):
    """members: {case id: (block ms, numerics ok)} -> sessions/layer/tp2 as Launcher.session writes it."""
    d = run_dir / "sessions" / "layer" / "tp2"
    runs = {}
    for cid, (ms, ok) in members.items():
        rounds = [ms * x for x in DRIFT]
        m = d / cid.split("-", 2)[2]
        m.mkdir(parents=True)
        (m / "run.json").write_text(json.dumps({
            "case": cid, "status": "ok", "session": "layer/tp2",
            "timing": {"total_ms": {"median": statistics.median(rounds), "rounds": rounds,
                                    "round_ids": list(range(len(rounds)))}},
            "host": {"host_ms": 10.0}, "correctness": {"ok": ok}}))
        runs[cid] = f"{m.name}/run.json"
    (d / "session.json").write_text(json.dumps({"session": "layer/tp2", "runs": runs, "rounds": 4,
                                                "stop": "resolved after 4 rounds"}))
    return run_dir


def test_tuned_that_fails_numerics_gives_way_to_the_fastest_passing_setting(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (79.5, True), TUNED: (78.0, False)}),
                       TUNED)
    assert rec["winner"] == NEMO and not rec["numerics_failed"]
    assert "failed the numerics check" in rec["reason"]


def test_no_passing_overlap_setting_is_flagged(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (79.5, False), TUNED: (78.0, False)}),
                       TUNED)
    assert rec["winner"] is None and rec["numerics_failed"] is True


def test_a_failing_reference_cannot_displace_the_tuned_setting(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (70.0, False), TUNED: (78.0, True)}),
                       TUNED)
    assert rec["winner"] == TUNED
    passing = layer_record(S, 2, _session(tmp_path / "b", {NONE: (81.0, True), NEMO: (70.0, True),
                                                           TUNED: (78.0, True)}), TUNED)
    assert passing["winner"] == NEMO

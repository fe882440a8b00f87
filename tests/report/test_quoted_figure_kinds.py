"""tptune figures' kinds beyond the ratios (report.quoted_figures): each on the committed results, against the
records it reads, and the README copy that quotes it."""
import csv
import json
from pathlib import Path

import pytest

from tptune.errors import TptuneError
from tptune.report.quoted_figures import Figures

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "results"


def _figs(**defs) -> Figures:
    return Figures(RESULTS, spec={"figures": defs})


def test_run_cost_counts_the_runs_sessions_and_what_its_members_held():
    run = RESULTS / "tp24-llama3-70b-h200x4/rep1"
    sessions = [json.loads(f.read_text()) for f in run.glob("sessions/**/session.json")]
    rows = [r for r in csv.DictReader((run / "measurements.csv").open()) if r["status"] == "ok" and r["rounds"]]
    figs = _figs(c={"kind": "run_cost", "run": "tp24-llama3-70b-h200x4/rep1",
                    "format": "{sessions} {steps}+{points}+{blocks} {member_rounds} {held_s:.1f} {gap_s:.1f}"})
    n, kinds, mr, held, gap = figs.get("c").split()
    assert int(n) == len(sessions) == 32 and kinds == "22+8+2"
    assert int(mr) == sum(int(r["rounds"]) for r in rows) == 308
    assert held == f"{sum(float(r['wall_s']) for r in rows):.1f}" == "261.5"
    # the gap: a session's start after the last end on one of its GPUs (rep1 has TP 2 sessions on both pairs)
    assert gap == "0.9"
    readme = (RESULTS / "tp24-llama3-70b-h200x4/README.md").read_text()
    assert "<!-- figure:tp24.cost_rep1 -->32 | 308 | 261.5 | 0.9 s<!-- /figure -->" in readme


def test_run_cost_of_a_2_gpu_run_sums_what_a_run_without_search_would_spend():
    figs = _figs(c={"kind": "run_cost", "run": "knobs-llama3-70b-x2-fast-rep2",
                    "format": "{points_s:.1f} {blocks_s:.1f} {group_start_s:.1f} {outside_s:.1f} {gap_s:.2f} {no_search_s:.1f} "
                              "{op[fc1][steps]} {op[fc1][member_rounds]}"},
                 first={"kind": "run_cost", "run": "knobs-llama3-70b-x2-fast", "format": "{gap_s:.1f} {group_start_s}"})
    points, block, start, outside, gap, floor, steps, mr = figs.get("c").split()
    assert float(floor) == round(float(points) + float(block) + float(start) + float(outside) + 5 * float(gap), 1)
    assert (points, block, start, steps, mr) == ("64.7", "38.0", "19.7", "9", "80")
    # the first fast run started no worker group (one was warm): the gap before its sessions ~4 s
    assert figs.get("first") == "4.1 0"


def test_host_gives_a_settings_launch_time_against_its_gpu_time_and_the_sessions_host_behind_batches():
    block = "knobs-mixtral-8x7b-h200x2/sessions/layer/tp2"
    figs = _figs(op={"kind": "host", "session": "knobs-mixtral-8x7b-h200x2/sessions/qkv/tp2/point", "a": "chosen",
                     "format": "{host_ms:.4f} {gpu_ms:.4f} {failed}"},
                 block={"kind": "host", "session": block, "a": "ub.tuned_tp2", "format": "{host_ms:.4f} {ms:.2f} {failed} {batches}"})
    session = json.loads((RESULTS / block / "session.json").read_text())
    tuned = json.loads((RESULTS / block / session["runs"]["layer-tp2-ub.tuned_tp2"]).read_text())
    batches = [b for rel in session["runs"].values()
               for b in json.loads((RESULTS / block / rel).read_text())["host"]["batches"]]
    assert figs.get("block") == f"{tuned['host']['host_ms']:.4f} 34.35 15 15"
    assert sum(b["host_ahead"] is False for b in batches) == len(batches) == 15
    chosen = json.loads((RESULTS / "knobs-mixtral-8x7b-h200x2/decisions.json").read_text())["ops"]["qkv"]["winner"]["case"]
    point = RESULTS / "knobs-mixtral-8x7b-h200x2/sessions/qkv/tp2/point"
    rec = json.loads((point / json.loads((point / "session.json").read_text())["runs"][chosen]).read_text())["host"]
    assert figs.get("op") == f"{rec['host_ms']:.4f} {rec['gpu_ms']:.4f} 0"
    readme = (RESULTS / "knobs-mixtral-8x7b-h200x2/README.md").read_text()
    assert "<!-- figure:mixtral.qkv_host -->1.6 ms against 0.54 ms<!-- /figure -->" in readme


def test_numerics_takes_each_tensors_largest_error_over_the_settings_of_its_files():
    files = ["qwen3-30b-a3b-h200x4-tp4/layer/tp4.json"]
    figs = _figs(all={"kind": "numerics", "files": files, "format": "{output:.4f} {input_grad:.4f} {weight_grads:.4f} {min:.4f} {passed}/{settings}"},
                 tuned={"kind": "numerics", "files": files, "a": "ub.tuned_tp4", "format": "{max:.4f}"})
    settings = json.loads((RESULTS / files[0]).read_text())["settings"]
    ratio = {t: [st["numerics"]["summary"][t]["l2_ratio"] for st in settings] for t in ("output", "input_grad", "weight_grads")}
    assert figs.get("all") == (f"{max(ratio['output']):.4f} {max(ratio['input_grad']):.4f} {max(ratio['weight_grads']):.4f} "
                               f"{min(min(v) for v in ratio.values()):.4f} {len(settings)}/{len(settings)}")
    tuned = next(st for st in settings if st["variant"] == "ub.tuned_tp4")["numerics"]["summary"]
    assert figs.get("tuned") == f"{max(v['l2_ratio'] for v in tuned.values()):.4f}"
    assert "(<!-- figure:qwen3_tp4.numerics -->≤ 1.01× / 1.02×" in (RESULTS / "qwen3-30b-a3b-h200x4-tp4/README.md").read_text()


def test_the_accounts_ops_share_is_the_ops_exposed_time_over_the_written_block():
    figs = _figs(s={"kind": "account", "session": "knobs-mixtral-8x7b-h200x2/sessions/layer/tp2",
                    "format": "{ops_exposed_ms:.6f} {written_ms:.6f} {ops_share:.6f}"})
    exposed, written, share = map(float, figs.get("s").split())
    assert abs(share - exposed / written) < 1e-5 and f"{share:.1%}" == "1.9%"


def test_the_account_of_a_block_session_measured_apart_takes_its_medians_and_the_runs_ops():
    """fp8-current's block2/ has no decisions.json: the run's op decisions, block2's block medians."""
    run, b2 = "fp8-current-llama3-70b-h200x4-tp4", "fp8-current-llama3-70b-h200x4-tp4/block2/sessions/layer/tp4"
    fmt = "{bound_ms:.4f} {written_ms:.4f} {left_ms:.4f} {in_ops_ms:.4f} {block_only_ms:.4f}"
    figs = _figs(b2={"kind": "account", "session": b2, "decisions": f"{run}/decisions.json", "format": fmt},
                 run={"kind": "account", "session": f"{run}/sessions/layer/tp4", "format": fmt},
                 bound={"kind": "median", "session": b2, "a": "nocomm", "format": "{ms:.4f}"},
                 tuned={"kind": "median", "session": b2, "a": "ub.tuned_tp4", "format": "{ms:.4f}"})
    bound, written, left, in_ops, block_only = map(float, figs.get("b2").split())
    assert (f"{bound:.4f}", f"{written:.4f}") == (figs.get("bound"), figs.get("tuned"))
    assert abs(left - (written - bound)) < 2e-4 and abs(block_only - (left - in_ops)) < 2e-4
    assert in_ops == float(figs.get("run").split()[3])          # the ops' side is the run's
    assert figs.get("run").split()[0] != figs.get("b2").split()[0]   # the run's own block had no finite bound
    text = (RESULTS / run / "README.md").read_text()
    assert f"<!-- figure:fp8c_tp4.b2_account -->{left:.3f} ms<!-- /figure -->" in text


def test_value_counts_a_recorded_list_and_reads_a_knob_steps_kept_ratio():
    rel = "tp24-llama3-70b-h200x4/rep1/decisions.json"
    dec = json.loads((RESULTS / rel).read_text())
    figs = _figs(ties={"kind": "value", "file": rel, "key": "ops.qkv.ties", "format": "{n}"},
                 ring={"kind": "value", "file": rel, "key": "ops.fc2.knob_search.4.changed.0.kept_ratio", "format": "×{value:.3f}"})
    assert figs.get("ties") == str(len(dec["ops"]["qkv"]["ties"])) == "4"
    # the report's search path prints the same step
    assert f"fc2_fprop.method pipeline→ring_exchange; {figs.get('ring')})" in (RESULTS / "tp24-llama3-70b-h200x4/rep1/report.md").read_text()


def test_host_counts_the_host_ahead_attempts_of_every_block_batch():
    """knobs-qwen3-30b-a3b-h200x2 ran with launch.host_attempts; the H100 pair before it retried every batch 4 times."""
    figs = _figs(**{run: {"kind": "host", "session": f"{run}/sessions/layer/tp2", "a": "ub.tuned_tp2",
                          "format": "{attempts} {batches} {attempts_per_batch:.1f}"}
                    for run in ("knobs-qwen3-30b-a3b-h200x2", "knobs-qwen3-30b-a3b-h100x2")})
    for run in ("knobs-qwen3-30b-a3b-h200x2", "knobs-qwen3-30b-a3b-h100x2"):
        block = RESULTS / run / "sessions/layer/tp2"
        runs = json.loads((block / "session.json").read_text())["runs"].values()
        batches = [b for rel in runs for b in json.loads((block / rel).read_text())["host"]["batches"]]
        attempts = sum(b["attempts"] for b in batches)
        assert figs.get(run) == f"{attempts} {len(batches)} {attempts / len(batches):.1f}"
    assert figs.get("knobs-qwen3-30b-a3b-h200x2") == "35 17 2.1" and figs.get("knobs-qwen3-30b-a3b-h100x2") == "124 31 4.0"
    readme = (RESULTS / "README.md").read_text()
    assert ("<!-- figure:qwen3_h200x2.attempts -->2.1<!-- /figure --> host-ahead attempts per block batch instead of "
            "<!-- figure:qwen3_h100x2.attempts -->4.0<!-- /figure -->") in readme


def test_run_cost_sums_the_seconds_of_every_session():
    run = "knobs-llama3-70b-x2-fast-rep2"
    figs = _figs(c={"kind": "run_cost", "run": run, "format": "{sessions_s:.3f} {steps_s:.3f} {points_s:.3f} {blocks_s:.3f}"})
    total, *kinds = map(float, figs.get("c").split())
    walls = [json.loads(f.read_text())["wall_s"] for f in (RESULTS / run).glob("sessions/**/session.json")]
    assert abs(total - sum(walls)) < 2e-3 and abs(total - sum(kinds)) < 2e-3
    assert "sessions alone take <!-- figure:fast_rep2.cost_row -->217 s: TP points 65 s" in (RESULTS / "README.md").read_text()


def test_verify_numerics_takes_the_legitimate_settings_largest_error_and_each_mismatched_pair():
    """numerics-calibration: verify.json names the mismatched pairs (their switches); every other setting's
    run.json tensors are legitimate."""
    runs = ["numerics-calibration/h100x4-llama3-70b-tp2", "numerics-calibration/h100x2-qwen3-30b-a3b-tp2"]
    figs = _figs(both={"kind": "verify_numerics", "runs": runs, "format": "{legit_l2:.4f} {legit_maxdiff:.4f}"},
                 tp2={"kind": "verify_numerics", "runs": runs[:1], "format": "{legit_l2:.4f} {pair[ub.pair1][l2_ratio]:.4f} "
                                                                          "{pair[ub.pair1][failed]} {pair[ub.pair2][status]}"})
    l2, maxdiff = [], []
    for rel in runs:
        verify = json.loads((RESULTS / rel / "verify.json").read_text())
        pairs = {r["setting"] for r in verify["block"]["rows"] if r.get("switches")}
        for rj in (RESULTS / rel).glob("sessions/layer/tp*/*/run.json"):
            tensors = (json.loads(rj.read_text()).get("correctness") or {}).get("tensors") or {}
            if rj.parent.name not in pairs and tensors:
                l2 += [t["l2_ratio"] for t in tensors.values()]
                maxdiff += [t["max_ratio"] for t in tensors.values()]
    assert figs.get("both") == f"{max(l2):.4f} {max(maxdiff):.4f}"
    pair = json.loads((RESULTS / runs[0] / "sessions/layer/tp2/ub.pair1/run.json").read_text())["correctness"]["tensors"]
    legit, worst, failed, refused = figs.get("tp2").split()
    assert float(legit) < float(figs.get("both").split()[0]) and failed == "True" and refused == "failed"
    assert worst == f"{max(t['l2_ratio'] for t in pair.values()):.4f}"
    assert "(<!-- figure:calib.legit -->1.04×<!-- /figure --> at most)" in (RESULTS / "README.md").read_text()


def test_verify_numerics_refuses_a_folder_that_is_no_verify_run():
    figs = _figs(x={"kind": "verify_numerics", "runs": ["knobs-llama3-70b-x2"], "format": "{legit_l2}"})
    with pytest.raises(TptuneError, match="knobs-llama3-70b-x2: no verify.json"):
        figs.get("x")


def test_spread_is_max_over_min_of_the_recorded_calls_not_the_rounded_summary():
    """noise-x2/noise-window500.json's summary rounds proj's spread to 0.0065 (0.7%); its 7 calls give 0.645%."""
    rel = "noise-x2/noise-window500.json"
    figs = _figs(s={"kind": "spread", "file": rel, "key": "calls.proj/gpu", "format": "{spread:.4%} {n} {median:.3f}"},
                 bad={"kind": "spread", "file": rel, "key": "tp"})
    rec = json.loads((RESULTS / rel).read_text())
    ms = [c["ms"] for c in rec["calls"]["proj/gpu"]]
    assert figs.get("s") == f"{max(ms) / min(ms) - 1:.4%} 7 {sorted(ms)[3]:.3f}"
    summary = next(x for x in rec["summary"] if (x["op"], x["mode"]) == ("proj", "gpu"))
    assert f"{summary['spread']:.1%}" == "0.7%" and figs.get("s").startswith("0.645")
    assert "**<!-- figure:noise_x2.window500.proj.gpu -->0.6%<!-- /figure -->" in (RESULTS / "README.md").read_text()
    with pytest.raises(TptuneError, match="tp is no list of records"):
        figs.get("bad")

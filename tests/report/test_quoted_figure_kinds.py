"""tptune figures' kinds beyond the ratios (report.quoted_figures): each on the committed results, against the
records it reads, and the README copy that quotes it."""
import csv
import json
from pathlib import Path

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

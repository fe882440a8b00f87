"""One definition per statement (issue 54 item 8): a run's report never says a thing in one place and its
opposite in another. The committed CPU run (tests/fixtures/cpu/tiny-default) and a committed GPU run re-derived
with `tptune rederive` in a scratch copy, one record edited where the defect needs what the run did not have."""
from __future__ import annotations

import json
import re

from conftest import ROOT, rederived


def _edit(run_json, fn):
    rec = json.loads(run_json.read_text())
    fn(rec)
    run_json.write_text(json.dumps(rec))


def _scale(run_json, factor):
    def scale(rec):
        tot = rec["timing"]["total_ms"]
        tot["rounds"] = [x * factor for x in tot["rounds"]]
        tot["median"] *= factor
    _edit(run_json, scale)


def _confidence(report):
    return report.split("**Confidence**")[1].split("\n\n")[0]


def test_a_block_setting_failing_the_numerics_at_any_tp_is_a_failure(tmp_path):
    """The CPU run's answer is TP 1, its block measured at TP 2; chunked.n2 made to fail the numerics check
    there. Before: "Failures: none." beside its **FAILED** in "Layer at TP=2"."""
    def wrong(rec):
        c = rec["correctness"]
        c["ok"], c["failed"] = False, ["input_grad"]
        c["summary"]["input_grad"].update(ok=False, l2_ratio=3.0)
    _, report = rederived(tmp_path, edit=lambda r: _edit(r / "sessions/layer/tp2/chunked.n2/run.json", wrong))
    assert "| `chunked.n2` |" in report and "**FAILED**" in report
    assert "- Failures: none." not in report
    assert "- Failures: 1 block setting(s) failed the numerics check (`layer-tp2-chunked.n2`" in report


def test_bound_fault_is_said_only_where_the_confidence_counts_one(tmp_path):
    """fp8-llama3-70b-x2's fc1 bound reads 0.995 [0.961, 1.029] of no overlap: at it within the noise, no
    fault. Before: its TP line said "bound fault" (its medians 9.728 against 9.721) beside "Faults: no bound
    fault." under Confidence."""
    _, report = rederived(tmp_path, ROOT / "results" / "fp8-llama3-70b-x2")
    assert "- Faults: no bound fault." in _confidence(report)
    assert "bound fault" not in report.replace("- Faults: no bound fault.", "")


def test_a_fault_is_slower_beyond_the_noise(tmp_path):
    """fc1's chunked.n2 made faster (its rounds × 0.797) so the bound reads 1.030 [0.595, 1.785] of it over
    two rounds, while the bound reads 0.766 of no overlap. Before: listed as a bound fault (its estimate above
    1 + the margin), "(fault)" on a bound 23% faster than no overlap, and one fault counted under Confidence."""
    _, report = rederived(tmp_path, edit=lambda r: _scale(r / "sessions/fc1/tp2/point/chunked.n2/run.json",
                                                           0.821 / 1.03))
    listed = re.findall(r"- `[^`]+` above `[^`]+`: ratio ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", report)
    assert all(float(lo) > 1 for _, lo, _ in listed), listed
    assert "(fault)" not in report
    assert "- Faults: no bound fault." in _confidence(report)


def test_the_cpu_runs_set_is_neither_proven_nor_handed_out(tmp_path):
    """The CPU block's none against chunked.n2: 0.906 [0.813, 1.010] over 4 rounds, "tuned undecided" in "Layer at
    TP=2" and "undecided: layer-tp2-chunked.n2" in its stop. Before: its set "proven on the block". And the set
    is chunked_cfg.tp2.yaml, the torch backend's chunk map, which `tptune check` refuses ("unknown GEMM").
    Before: "If you must train with tensor parallelism anyway, take that TP's own files" naming it."""
    run, report = rederived(tmp_path)
    assert "tuned undecided" in report
    assert "proven on the block" not in report
    s = json.loads((run / "decisions.json").read_text())["meta"]["files"]["sets"]["2"]
    assert s["status"] == "undecided" and "undecided against `chunked.n2`" in s["why"], s
    first = report.split("## How it was measured")[0]
    assert "take that TP's own files" not in first and "**Load**" not in first
    assert "`chunked_cfg.tp2.yaml`: the torch backend's chunk map, which no framework loads" in first

"""The burn_in figure kind (report.figure_bound) on committed point sessions: leaving the bound's first round
out removes the FP8 x2 run's two bound faults and keeps the Llama-3-70B defaults run's real one."""
import pytest

from tptune.report.figure_bound import burn_in_figure
from tptune.stats.bound import bound_faults, burned_in, is_bound
from tptune.records.sessions import load_session

from conftest import ROOT

RESULTS = ROOT / "results"


def test_the_first_round_makes_two_faults_that_its_burn_in_removes():
    got = burn_in_figure(RESULTS, {"runs": ["fp8-current-llama3-70b-x2"]})
    assert (got["faults_before"], got["faults_after"]) == (2, 0)
    assert got["share_after"] < got["share_before"]
    assert got["rounds_after"] < got["rounds_before"]       # one round fewer per setting


def test_a_fault_that_stays_after_the_burn_in_is_the_one_the_report_lists():
    got = burn_in_figure(RESULTS, {"runs": ["defaults-llama3-70b-h100x4"]})
    assert got["faults_after"] == 1
    s = load_session(RESULTS / "defaults-llama3-70b-h100x4/sessions/proj/tp4/point", strict=False)
    pts = dict(s.points)
    b = next(c for c in pts if is_bound(c))
    pts[b] = burned_in(pts[b])
    assert [f["above"] for f in bound_faults(pts)] == [
        "proj-tp4-ub.te+fprop.ring.sm1.cga1.margin0.agg0.ce1+dgrad.ring.sm1.cga1.margin0.agg0.ce1"]


def test_an_unknown_run_folder_is_named():
    with pytest.raises(ValueError, match="runs: no folder nope under results/"):
        burn_in_figure(RESULTS, {"runs": ["nope"]})

"""The stopping_replay figure kind (report.figure_stopping) on committed sessions, and a calc figure whose value
names a kind's field (the futility stop's saving reused in a projection, not copied)."""
import pytest

from tptune.errors import TptuneError
from tptune.report.figure_calc import calc
from tptune.report.figure_stopping import stopping_figure
from tptune.report.quoted_figures import Figures

from conftest import ROOT

RESULTS = ROOT / "results"


def test_the_futility_stop_replayed_on_one_run():
    got = stopping_figure(RESULTS, {"runs": ["verify-llama3-70b-x2"]})
    # its block session stops after 4 rounds instead of 6 (16 member-rounds, not 23); the op sessions as recorded
    assert got["sessions"] == 5 and got["off"] - got["on"] >= 23 - 16
    assert got["saved"] == pytest.approx(1 - got["on"] / got["off"])
    with pytest.raises(ValueError, match="runs: no folder nope"):
        stopping_figure(RESULTS, {"runs": ["nope"]})


def test_a_calc_value_names_a_kinds_field():
    saved = stopping_figure(RESULTS, {"runs": ["verify-llama3-70b-x2"]})["saved"]
    d = {"kind": "calc", "expr": "100 - 100 * s", "format": "{value:.3f}",
         "values": {"s": {"kind": "stopping_replay", "runs": ["verify-llama3-70b-x2"], "field": "saved"}}}
    assert Figures(RESULTS, spec={"figures": {"x": d}}).get("x") == f"{100 - 100 * saved:.3f}"
    with pytest.raises(ValueError, match="need the figures' resolver"):
        calc(RESULTS, d)
    bad = {**d, "values": {"s": {**d["values"]["s"], "field": "savings"}}}
    with pytest.raises(TptuneError, match="field 'savings' is none of sessions, exact"):
        Figures(RESULTS, spec={"figures": {"x": bad}}).get("x")

"""The window and first_member figure kinds (report.figure_window): on committed recordings they give what
stats.window computes from the recorded iterations; a recording built here checks each measure's definition;
what names nothing recorded is refused with the field."""
import json
import math
import shutil

import pytest

from tptune.errors import TptuneError
from tptune.report.figure_window import first_member_figure, window_figure
from tptune.report.quoted_figures import Figures
from tptune.stats.window import first_member_effect, round_values

from conftest import ROOT

RESULTS = ROOT / "results"


def _recording(tmp_path, members: dict) -> str:
    rec = {"pair": ["none", "nocomm"], "ops": {"qkv": {"members": members, "table": []}}}
    (tmp_path / "rec.json").write_text(json.dumps(rec))
    return "rec.json"


def test_level_pairs_a_short_skip_with_a_long_one_round_by_round(tmp_path):
    # each round: 2 ms of fast iterations (an unsettled card), then 1.0 ms ones; member nocomm flat
    rounds = [[0.5] * 4 + [1.0] * 20, [0.5] * 4 + [1.0] * 20, [0.5] * 4 + [1.0] * 20]
    f = _recording(tmp_path, {"qkv-tp1-none": {"rounds": rounds, "min_iters": 1},
                              "qkv-tp1-nocomm": {"rounds": [[1.0] * 24] * 3, "min_iters": 1}})
    d = {"measure": "level", "file": f, "op": "qkv", "member": "none", "window_ms": 4.0, "against_skip_ms": 2.0}
    got = window_figure(tmp_path, d)
    # a 4 ms window with no skip: 0.5 x 4 then 1.0 x 2 -> median 0.5; after a 2 ms skip: 1.0
    assert got["ratio"] == pytest.approx(0.5) and got["rounds"] == 3
    assert window_figure(tmp_path, {**d, "member": "nocomm"})["ratio"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no member 'bound'"):
        window_figure(tmp_path, {**d, "member": "bound"})


def test_bins_split_the_named_bins_from_the_rest(tmp_path):
    flat, bump = [1.0] * 30, [1.0] * 10 + [1.05] * 10 + [1.02] * 10
    f = _recording(tmp_path, {"qkv-tp1-none": {"rounds": [bump, bump], "min_iters": 1},
                              "qkv-tp1-nocomm": {"rounds": [flat, flat], "min_iters": 1}})
    got = window_figure(tmp_path, {"measure": "bins", "file": f, "bin_ms": 10, "n_bins": 3, "apart": [1]})
    assert got["apart_lo"] == pytest.approx(0.0) and got["apart_hi"] == pytest.approx(0.05)
    # the bumped member's bin 1 holds the 1.05 ms iterations (they start at 10-19.45 ms), bin 2 the 1.02 ones
    assert got["within"] == pytest.approx(0.02)


def test_committed_calibrations_give_what_stats_window_computes():
    f = "noise-h100/window-h100-shard2.json"
    rec = json.loads((RESULTS / f).read_text())
    spreads = [max(v) / min(v) - 1 for o in rec["ops"].values() for m in o["members"].values()
               for v in [round_values(m["rounds"], 500, m["min_iters"], 150)]]
    got = window_figure(RESULTS, {"measure": "spread", "file": f, "window_ms": [500], "skip_ms": 150})
    assert (got["min"], got["max"]) == (min(spreads), max(spreads))
    files = [f"window-calibration-h100/{c}/window.json" for c in ("call1", "call2", "call3-other-card")]
    fm = window_figure(RESULTS, {"measure": "first_member", "files": files, "window_ms": 500})
    assert fm["n"] == 12 and -0.06 < fm["effect"] < 0.0


def test_first_member_follows_each_sessions_recorded_order(tmp_path):
    run = "verify-llama3-70b-x2"
    shutil.copytree(RESULTS / run, tmp_path / run)
    got = first_member_figure(tmp_path, {"runs": [run]})
    # reverse every session's order: another member ran first, so other pairs are measured
    for sj in (tmp_path / run).rglob("session.json"):
        rec = json.loads(sj.read_text())
        if rec.get("order"):
            rec["order"] = [list(reversed(o)) for o in rec["order"]]
            sj.write_text(json.dumps(rec))
    flipped = first_member_figure(tmp_path, {"runs": [run]})
    assert got["pairs"] >= 2 and flipped["pairs"] >= 2
    assert flipped["effect"] != got["effect"]
    with pytest.raises(ValueError, match="no folder 'nope'"):
        first_member_figure(tmp_path, {"runs": ["nope"]})


def test_a_figure_names_an_unknown_measure():
    figs = Figures(RESULTS, spec={"figures": {"x": {"kind": "window", "measure": "mode",
                                                    "file": "noise-h100/window-h100-shard2.json", "format": "{x}"}}})
    with pytest.raises(TptuneError, match="figure x: measure 'mode' is none of level, spread, bins"):
        figs.get("x")


def test_first_member_effect_on_a_two_member_session_matches_the_pair():
    assert first_member_effect({0: 1.0, 1: 2.0, 2: 2.0}, {0: 1.0, 1: 1.0, 2: 1.0}) == pytest.approx(-math.log(2))


def test_a_measure_noise_recordings_batches_stand_for_rounds(tmp_path):
    # one GPU-timed call of two batches (10 ms bins: the second batch steps from 1.0 to 1.1 ms), and an
    # events-timed call whose iterations are not its batches' (left out)
    call = {"call": 0, "iterations_ms": [1.0] * 20 + [1.0] * 10 + [1.1] * 10,
            "batches": [{"iters": 20}, {"iters": 20}]}
    events = {"call": 0, "iterations_ms": [9.0] * 3, "batches": [{"iters": 20}]}
    (tmp_path / "noise.json").write_text(json.dumps({"calls": {"qkv/gpu": [call], "qkv/events": [events]}}))
    got = window_figure(tmp_path, {"measure": "steps", "file": "noise.json", "bin_ms": 10})
    assert got["max"] == pytest.approx(0.1)
    assert got["median_lo"] == got["median_hi"] == pytest.approx(0.05)     # the median of 0 and 0.1
    two = window_figure(tmp_path, {"measure": "steps", "files": ["noise.json", "noise.json"], "bin_ms": 10})
    assert two["max"] == pytest.approx(0.1)

"""The confirm stage's reading and statistics on the committed GPU recordings: both three-round confirms on
4x H200 (results/tp24-llama3-70b-h200x4/rep1, results/confirm-mistral-small-24b-h200x4), every launch's real
Megatron-LM log under confirm/logs/. Parsing each log again gives the iterations, medians and verdicts that
confirm.json records, and the ratios and the loss rule recomputed from those launches are confirm.json's."""
import json

import pytest

from conftest import ROOT
from tptune.confirm import compare
from tptune.confirm.megatron_log import as_dicts, failure_kind, median_ms, parse_iterations
from tptune.confirm.stage import PAIRS

RUNS = ["results/tp24-llama3-70b-h200x4/rep1", "results/confirm-mistral-small-24b-h200x4"]


@pytest.mark.parametrize("run", RUNS)
def test_every_recorded_log_parses_to_what_confirm_json_holds(run):
    rec = json.loads((ROOT / run / "confirm.json").read_text())
    assert rec["rounds"] == 3 and len(rec["launches"]) == 9
    for launch in rec["launches"]:
        text = (ROOT / run / launch["log"]).read_text()
        its = parse_iterations(text)
        assert failure_kind(text) is None and launch["status"] == "ok"
        assert [i.iteration for i in its] == list(range(1, rec["iterations"] + 1))
        assert as_dicts(its) == launch["iterations"]
        assert median_ms(its, rec["timed_from"]) == launch["median_ms"]
        # the first two iterations carry the set-up: each longer than any timed one
        assert min(its[0].ms, its[1].ms) > 2 * max(i.ms for i in its if i.iteration >= rec["timed_from"])


@pytest.mark.parametrize("run", RUNS)
def test_the_ratios_and_the_loss_rule_recomputed_from_the_launches_are_recorded(run):
    rec = json.loads((ROOT / run / "confirm.json").read_text())
    again = compare.ratios(rec["launches"], PAIRS, rec["margin"])
    assert {k: again[k] for k in rec["ratios"]} == rec["ratios"]
    for s in ("set", "preset"):
        got = compare.numerics(rec["launches"], s, "none", n=rec["loss_iterations"])
        assert got == rec["numerics"][s]
        assert got["ok"] is True and got["loss"]["difference"] <= got["loss"]["allowed"]
    sp = rec["ratios"]["set/preset"]
    assert sp["lo"] <= sp["ratio"] <= sp["hi"] and sp["rounds"] == 3

"""The report's answer card on committed GPU runs: pooled block figures, the capped efficiency, the
reason for the model TP, and the summary figure's paired ratios."""
import json
from pathlib import Path

import pytest

from tptune.report.card import answer_card, plot_summary, summary_rows
from tptune.cli.main import _settings
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_sessions

RESULTS = Path(__file__).parents[2] / "results"


def _card(run):
    run_dir = RESULTS / run
    decisions = json.loads((run_dir / "decisions.json").read_text())
    return answer_card(_settings(str(run_dir / "config.json")), RunDir(run_dir), decisions, []), decisions, run_dir


def test_knobs_run_card_quotes_the_pooled_block_figure_against_the_best_preset():
    card, decisions, _ = _card("knobs-llama3-70b-x2")
    best = card["block"]["best_preset"]
    # the preset the tuned block gains least against, pooled over the seven sessions that measured it (the
    # run, its repeat, four tptune verify sessions of its file on two leases, rs-dgrad-x2's experiment)
    assert best["variant"] == "ub.nvidia_bf16_tp2" and best["pooled_sessions"] == 7
    assert best["ratio"]["rounds"] == 36
    assert best["ratio"]["ratio"] == pytest.approx(0.977, abs=0.001)
    assert best["ratio"]["lo"] == pytest.approx(0.975, abs=0.001) and best["ratio"]["hi"] == pytest.approx(0.979, abs=0.001)
    assert best["words"] == "faster beyond the margin"
    refs = {r["variant"]: r for r in card["block"]["references"]}
    assert set(refs) == {"none", "ub.te"} and all(r["pooled_sessions"] == 7 for r in refs.values())
    assert card["efficiency"].startswith("85% [60, 100]")
    assert card["model_tp"] == 2 and card["tp_reason"].startswith("overlap rule at TP 2")
    assert "tp_comm_overlap_cfg.yaml" in [f["name"] for f in card["load"]]
    assert "chunked_cfg.yaml" not in [f["name"] for f in card["load"]]     # a te run: no chunk map
    assert "--tp-comm-overlap-cfg tp_comm_overlap_cfg.yaml" in card["flags"]
    assert not card["cpu"]


def test_memory_floor_is_named_as_the_reason_when_it_raised_the_tp():
    card, decisions, _ = _card("stability-llama3-70b-x2/rep1")
    assert decisions["meta"]["model_tp_rule"] == 1 and card["model_tp"] == 2
    # the ops summed read 0.974 [0.967, 0.980] of no overlap: across the 2% margin, so the rule is undecided
    # and the memory floor decides (decide.tp.settle_undecided)
    assert card["tp_reason"].startswith("overlap rule at TP 2:") and "so the overlap rule is undecided" in card["tp_reason"]
    assert "the memory floor decides; memory floor: model TP=1 cannot hold the model" in card["tp_reason"]


def test_host_behind_block_batches_are_a_confidence_line():
    card, _, _ = _card("stability-llama3-70b-x2/rep1")
    line = [c for c in card["confidence"] if c.startswith("Block host evidence")]
    assert line and "failed the host-ahead check" in line[0]
    card, _, _ = _card("knobs-llama3-70b-x2")
    assert not [c for c in card["confidence"] if c.startswith("Block host evidence")]


def test_summary_rows_are_paired_ratios_against_no_overlap(tmp_path):
    _, decisions, run_dir = _card("knobs-llama3-70b-x2")
    rows = summary_rows(load_sessions(RunDir(run_dir)), decisions)
    assert [r["group"] for r in rows] == ["qkv", "proj", "fc1", "fc2", "block"]
    block = rows[-1]
    chosen = [b for b in block["bars"] if b["kind"] == "chosen"][0]
    none_row = [r for r in decisions["meta"]["layer"]["2"]["settings"] if r["variant"] == "none"][0]
    # tuned / none of the block from the session's rounds equals the layer stage's own comparison
    assert chosen["ratio"]["ratio"] == pytest.approx(none_row["tuned_vs"]["ratio"]["ratio"], abs=1e-4)
    for r in rows[:-1]:
        kinds = {b["kind"] for b in r["bars"]}
        assert {"TE defaults", "chosen", "bound"} <= kinds
        bound = [b for b in r["bars"] if b["kind"] == "bound"][0]
        assert bound["ratio"]["ratio"] < 1.0    # the bound is faster than no overlap on every op
    png = plot_summary(rows, tmp_path / "summary.png")
    assert png.stat().st_size > 5000


def test_a_memory_floor_below_every_measured_tp_asks_for_that_tp_and_names_no_setting_for_it():
    """Qwen3-30B-A3B measured at TP 4 only (4x H200): the overlap rule says TP 1, memory needs TP 2 x PP 3.
    The answer is TP 2, which nothing measured: no op may be labelled with a TP 4 setting under TP 2,
    and the card asks for TP 2 instead of saying no overlap passed there."""
    from tptune.decide.answer import decide

    run_dir = RESULTS / "qwen3-30b-a3b-h200x4-tp4"
    s = _settings(str(run_dir / "config.json"))
    run = RunDir(run_dir)
    answer = decide(s, run, [run.op_final(op) for op in s.ops])
    assert answer.meta["model_tp"] == 2 and answer.meta["model_tp_rule"] == 1
    for op in s.ops:
        rec = answer.records[op]
        assert rec["tp"] == 2 and rec["config"]["case"] is None and rec["config"]["variant"] == "not measured"
        assert "TP=2 (the memory floor) was not measured" in rec["config"]["note"]
    card, _, _ = _card("qwen3-30b-a3b-h200x4-tp4")
    assert card["unmeasured_tp"] == 2 and card["tp_reason"].endswith("TP 2 was not measured in this run")
    assert not card["load"]
    report = (run_dir / "report.md").read_text()
    assert "**Measure TP 2 first**" in report and "Train at TP 2 without TP comm overlap" not in report
    # a run whose floor TP was measured says nothing of the kind
    card, _, _ = _card("fp8-llama3-70b-h200x4-tp4")
    assert card["unmeasured_tp"] is None and "memory floor: model TP=1 cannot hold" in card["tp_reason"] and card["load"]


def test_tie_and_finalist_ratios_are_each_setting_over_the_chosen_one_as_the_report_says():
    """The per-op lists give each setting / the chosen one (a tie above 1: the chosen one is faster; a
    finalist below 1), not chosen / other as the table does; the report said chosen / other for both."""
    run = RESULTS / "fp8-current-llama3-70b-h200x4-tp4"
    d = json.loads((run / "decisions.json").read_text())
    text = (run / "report.md").read_text()
    assert "in the lists below, each setting / the chosen one (above 1: the chosen one is faster)" in text
    sess = {}
    for op in ("qkv", "fc1"):
        for f in (run / "sessions" / op / "tp4" / "point").glob("*/run.json"):
            r = json.loads(f.read_text())
            sess[r["case"]] = r["timing"]["total_ms"]["median"]
    chosen = {op: d["ops"][op]["winner"]["case"] for op in ("qkv", "fc1")}
    for op in ("qkv", "fc1"):
        for t in d["ops"][op]["ties"] + d["ops"][op]["finalists"]:
            # the ratio's side of 1 is the medians' (each setting against the chosen one)
            assert (t["ratio"] > 1) == (sess[t["case"]] > sess[chosen[op]]), (op, t["case"])
    assert d["ops"]["fc1"]["finalists"] and all(f["ratio"] < 1 for f in d["ops"]["fc1"]["finalists"])


@pytest.mark.parametrize("run,moe_reason", [
    ("knobs-mixtral-8x7b-h200x2", True),       # MoE, every block batch behind the host
    ("knobs-qwen3-30b-a3b-h100x2", True),
    ("fp8-llama3-70b-h200x4-tp4", False),      # dense, 3 of 25 behind
])
def test_an_moe_block_behind_the_host_in_every_batch_says_why(run, moe_reason):
    card, _, _ = _card(run)
    line = next(ln for ln in card["confidence"] if ln.startswith("Block host evidence"))
    assert ("token dispatch waits on the host for the tokens per expert" in line) is moe_reason

"""report.block_account: where the written file's block time above its (estimated) bound goes, from decisions.json
of committed runs (4x H200 TP 2 + 4, one with no block)."""
import json
from pathlib import Path

import pytest

from tptune.report.block_account import block_account

RESULTS = Path(__file__).parents[2] / "results"


def _decisions(run):
    return json.loads((RESULTS / run / "decisions.json").read_text())


def test_tp4_block_account_adds_up_and_names_each_reference():
    d = _decisions("tp24-llama3-70b-h200x4/rep1")
    acc = {a["tp"]: a for a in block_account(d)}
    assert sorted(acc) == [2, 4]
    a = acc[4]
    layer = d["meta"]["layer"]["4"]
    rows = {r["variant"]: r["median_ms"] for r in layer["settings"]}
    assert a["none_ms"] == rows["none"] and a["written_ms"] == rows["ub.tuned_tp4"] and a["num_layers"] == 2
    # the ops' exposed time: num_layers x sum(no overlap - bound), each from its TP point's medians
    per_op = sum(d["ops"][op]["points"]["4"]["none"]["timing"]["total_ms"]["median"]
                 - d["ops"][op]["points"]["4"]["nocomm"]["timing"]["total_ms"]["median"] for op in d["ops"])
    assert a["exposed_ms"] == pytest.approx(2 * per_op)
    assert a["bound_ms"] == pytest.approx(a["none_ms"] - a["exposed_ms"])
    assert a["hidden"] == pytest.approx((a["none_ms"] - a["written_ms"]) / a["exposed_ms"])
    assert 0.4 < a["hidden"] < 0.7
    assert a["left_ms"] == pytest.approx(a["in_ops_ms"] + a["block_only_ms"])
    assert a["in_ops_ms"] == pytest.approx(2 * sum(o["left_ms"] for o in a["ops"]))
    refs = {r["variant"]: r for r in a["references"]}
    assert {"ub.nemo_tp4", "ub.nemo_tp4_recipe", "ub.nvidia_bf16_tp2", "ub.te"} == set(refs)
    for r in refs.values():   # every reference is slower than the tuned block here, so further from the bound
        assert r["limit"] == pytest.approx(r["ms"] / a["bound_ms"]) and r["limit"] > a["written_ms"] / a["bound_ms"]


def test_no_block_no_account():
    assert block_account(_decisions("stability-llama3-70b-x2-v4/rep1")) == []


def test_a_bound_that_was_not_finite_is_not_used():
    """FP8 current scaling at TP 4 (4x H200): the block's bound gathered another tensor's FP8 bytes and
    computed inf/NaN (fixed since: te_common.LocalCollectives); the account keeps the ops' estimate and
    says why. block2, measured after the fix, is finite."""
    d = _decisions("fp8-current-llama3-70b-h200x4-tp4")
    rows = {r["variant"]: r for r in d["meta"]["layer"]["4"]["settings"]}
    assert rows["nocomm"]["numerics"]["ok"] is False and rows["nocomm"]["median_ms"]
    a = {a["tp"]: a for a in block_account(d)}[4]
    assert a["bound_not_finite"] and not a["bound_measured"]
    assert a["bound_ms"] == pytest.approx(a["none_ms"] - a["ops_exposed_ms"])
    text = (RESULTS / "fp8-current-llama3-70b-h200x4-tp4/report.md").read_text()
    assert "its output or gradients were not finite" in text
    second = json.loads((RESULTS / "fp8-current-llama3-70b-h200x4-tp4/block2/layer/tp4.json").read_text())
    assert next(r for r in second["settings"] if r["variant"] == "nocomm")["numerics"]["ok"] is True


def test_report_shows_the_account():
    text = (RESULTS / "tp24-llama3-70b-h200x4/rep1/report.md").read_text()
    assert "## Where the block's time above its bound goes (TP 4, 2 layers, medians, ms)" in text
    assert "an account, not a decision" in text


def test_a_measured_block_bound_replaces_the_estimate():
    """Where the block session measured its own bound (layer.bound: the nocomm block), the account uses it
    and keeps the ops' estimate beside it; the bound is no reference."""
    d = _decisions("tp24-llama3-70b-h200x4/rep1")
    layer = d["meta"]["layer"]["4"]
    none_ms = next(r["median_ms"] for r in layer["settings"] if r["variant"] == "none")
    estimate = {a["tp"]: a for a in block_account(d)}[4]
    layer["settings"].append({"case": "layer-tp4-nocomm", "variant": "nocomm", "status": "ok",
                              "median_ms": none_ms - 3.0})
    a = {a["tp"]: a for a in block_account(d)}[4]
    assert a["bound_measured"] and not estimate["bound_measured"]
    assert a["bound_ms"] == pytest.approx(none_ms - 3.0) and a["exposed_ms"] == pytest.approx(3.0)
    assert a["ops_exposed_ms"] == pytest.approx(estimate["exposed_ms"])
    assert a["hidden"] == pytest.approx((none_ms - a["written_ms"]) / 3.0)
    assert "nocomm" not in {r["variant"] for r in a["references"]}
    assert a["left_ms"] == pytest.approx(a["in_ops_ms"] + a["block_only_ms"])


def test_the_account_follows_the_written_file_where_the_block_picked_another():
    """rep4 (4x H200): the block's own bound measured on the GPU at both TPs, paired shares from the block
    session; at TP 4 the block wrote tptune's fastest combination over the tuned one, so the account's
    subject is that file and the tuned combination is one of its references."""
    d = _decisions("tp24-llama3-70b-h200x4/rep4")
    acc = {a["tp"]: a for a in block_account(d)}
    assert all(a["bound_measured"] for a in acc.values())
    a = acc[4]
    rows = {r["variant"]: r["median_ms"] for r in d["meta"]["layer"]["4"]["settings"]}
    assert a["written"] == "ub.fastest_tp4" and a["picked_over_tuned"]
    assert a["written_ms"] == rows["ub.fastest_tp4"] and a["bound_ms"] == rows["nocomm"]
    refs = {r["variant"]: r for r in a["references"]}
    assert "ub.tuned_tp4" in refs and "ub.fastest_tp4" not in refs and "nocomm" not in refs
    assert refs["ub.tuned_tp4"]["limit"] > a["written_ms"] / a["bound_ms"]
    assert not acc[2]["picked_over_tuned"] and acc[2]["written"] == "ub.tuned_tp2"
    text = (RESULTS / "tp24-llama3-70b-h200x4/rep4/report.md").read_text()
    assert "The written file (`ub.fastest_tp4`, the block-level winner over the tuned combination" in text


def test_committed_block_accounts_print_no_share_beyond_its_definition():
    """Every committed report's block account: shares between 0% and 100% (stats.efficiency's definition),
    and where a setting reads below the ops' estimate (Qwen3-30B-A3B's host-bound MoE block) no share at
    all: the estimate is said to be no bound there."""
    import re

    texts = {p: p.read_text() for p in RESULTS.rglob("report.md") if "legacy" not in p.parts}
    sections = [s.split("## Plan")[0] for t in texts.values() for s in t.split("## Where the block's time")[1:]]
    assert len(sections) >= 19
    for s in sections:
        for pct in re.findall(r"(-?\d+)%", s):
            assert 0 <= int(pct) <= 100, s
    moe = (RESULTS / "knobs-qwen3-30b-a3b-h100x2" / "report.md").read_text()
    assert "Here it is no bound: `ub.fastest_tp2`, `ub.nvidia_bf16_tp2` read below it" in moe

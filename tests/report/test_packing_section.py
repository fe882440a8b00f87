"""The report's packing answer (report.packing_section, issue 53) from a packing.json of a te run: the sentence in
the answer card before the model TP, the section after the card with the best preset's column, the padding
against the overlap, memory that does not fit said in bold, and veRL's gap; a run that decided nothing says why."""
from __future__ import annotations

import json

from tptune.measure.preflight import resolve_here
from tptune.report.packing_section import packing_headline, packing_section, with_packing_section
from tptune.report.render import _environment
from tptune.records.run_dir import RunDir

from conftest import base_config

GIB = 1024 ** 3


def r(ratio, lo, hi, n=4, words=None):
    return {"ratio": ratio, "lo": lo, "hi": hi, "rounds": n, "paired": True, **({"words": words} if words else {})}


def record(cap=8192):
    rows, caps = [], []
    for t, vs in ((8192, r(1.045, 1.031, 1.059)), (16384, r(1.12, 1.1, 1.14))):
        rows.append({"capacity": t, "session": f"layer/tp4/pack{t}", "rounds": 4, "set": "ub.tuned_tp4",
                     "preset": "ub.nemo_tp4", "bins_per_step": 3.2, "padding_share": 0.31, "ub_gib": 1.5 * t / 8192,
                     "ratios": {"set/none": r(0.965, 0.955, 0.975, words="faster beyond the margin"),
                                "set/none forward-only": r(0.97, 0.96, 0.98), "preset/none": r(0.98, 0.97, 0.99)}})
        caps.append({"capacity": t, "padding_share": 0.31, "vs_native": vs, "padding_cost": r(1.083, 1.07, 1.096),
                     "overlap": r(0.965, 0.955, 0.975)})
    return {"verdict": "off", "capacity": cap, "tp": 4, "tp_why": "the model TP (4)", "rule": "verl",
            "spec": {"seqs_per_step": 8, "forward_passes": 2, "max_token_len": 16384},
            "sentence": "Keep overlap off: padding to T = 8192 costs 8.3% [7.0%, 9.6%] of the step.",
            "rows": rows, "problems": [], "decision": {"capacities": caps},
            "native": {"micro_batches_per_step": 2.1, "largest": 17011, "padding_share": 0.001,
                       "over_budget_share": 0.12,
                       "fit": {"degree": 1, "residual": 0.004, "outside": 0.1, "tokens": [6000, 11000, 16400]}},
            "memory": {"ub_bytes": {"8192": int(1.5 * GIB), "16384": 3 * GIB}, "ub_gib": {"8192": 1.5, "16384": 3.0},
                       "headroom_bytes": GIB, "why": "the memory floor at TP 4 leaves 1.00 GiB"},
            "frameworks": [{"framework": "megatron_lm", "ready": True, "needs": [], "option_problems": []},
                           {"framework": "verl", "ready": False, "needs": ["call initialize_ub"],
                            "option_problems": []}],
            "files": {"megatron_lm": "packing/megatron_lm.txt", "verl": "packing/verl.yaml",
                      "tp_comm_overlap_cfg": "packing/tp_comm_overlap_cfg.yaml"}}


def test_the_answer_leads_and_the_section_weighs_padding_against_overlap(tmp_path, pool_dir):
    run = RunDir(tmp_path)
    run.packing_json.write_text(json.dumps(record()))
    env = _environment(resolve_here(base_config(pool_dir), check_hardware=False))
    report = "# r\n\n## Answer\n\n**Model TP: 4** (x).\n\n## How it was measured\n\nx\n"
    text = with_packing_section(report, packing_section(env, run, 2, cpu=False), packing_headline(run))
    lines = text.splitlines()
    assert lines[4].startswith("**Packed micro-batches** (TP 4, against veRL's own batching")
    assert lines[4].endswith(record()["sentence"]) and lines[6].startswith("**Model TP: 4**")
    section = text[text.index("## Packed micro-batches"):text.index("## How it was measured")]
    assert "| best preset / no overlap |" in section and "| 8192 (chosen) | 3.2 | 31.0% |" in section
    assert "0.965 [0.955, 0.975] (faster beyond the margin)" in section and "| 0.980 [0.970, 0.990] |" in section
    assert "costs 8.3% [7.0%, 9.6%] of the step; overlap saves 3.5% [2.5%, 4.5%]" in section
    assert "adds 1.50 GiB" in section and "**It does not fit what the memory floor leaves.**" in section
    assert "**veRL (Megatron engine) cannot hold a fixed token count today**" in section and "call initialize_ub" in section
    assert "`packing/tp_comm_overlap_cfg.yaml` is the set they name" in section and "On CPU" not in section


def test_nothing_decided_says_why(tmp_path, pool_dir):
    run = RunDir(tmp_path)
    run.packing_json.write_text(json.dumps({"verdict": "unmeasured", "capacity": None, "tp": None, "rule": "slime",
                                            "sentence": "No packed block was measured: no TP of 2 or more."}))
    env = _environment(resolve_here(base_config(pool_dir), check_hardware=False))
    assert packing_section(env, run, 2, cpu=True).endswith("No packed block was measured: no TP of 2 or more.\n")
    assert packing_headline(run).startswith("**Packed micro-batches** (against slime's own batching")
    assert packing_headline(RunDir(tmp_path / "none")) == ""

"""The answer card states only what was measured (issue 34, item 7): the files it tells users to load come
from decisions.json meta["files"] (the default TP's set, copied unsuffixed), with no TP chosen it says what
to do instead of listing overlap files, it shows no efficiency where nothing was compared, tptune's own
block combinations are never "presets", and a CPU run's report speaks of the CPU and says each paragraph
once. Runs recorded before meta["files"] existed still render from the files in their folder."""
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tptune.cli.main import _settings
from tptune.report.card import _preset, answer_card
from tptune.records.run_dir import RunDir
from tptune.report.render import card_markdown, render_report
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_config_files
from tptune.stats.efficiency import Efficiency

from conftest import FIXTURES, ROOT

OPS = ("qkv", "proj", "fc1", "fc2")
TE_KEYS = {"ub_cfgs_yaml": "tp_comm_overlap_cfg.tp{n}.yaml", "megatron_flags": "megatron_flags.tp{n}.txt",
           "overrides": "transformer_config_overrides.tp{n}.yaml", "bridge": "tp_overlap_cfg_nemo.tp{n}.py",
           "ub_cfgs_json": "ub_cfgs.tp{n}.json"}
UNSUFFIXED = ["tp_comm_overlap_cfg.yaml", "megatron_flags.txt", "transformer_config_overrides.yaml",
              "tp_overlap_cfg_nemo.py", "ub_cfgs.json"]


def settings(backend="torch", model=None, **over):
    cfg = load_config_files(ROOT / "config" / "config.yaml")
    cfg.update(model=str(model or ROOT / "config" / "models" / "tiny.yaml"), backend="torch", **over)
    s = resolve_here(cfg, check_hardware=False)
    return s if backend == "torch" else dataclasses.replace(s, backend="te", device="cuda")


def te_set(n, status, why, ok=True, problems=()):
    return {"tp": n, "files": {k: v.format(n=n) for k, v in TE_KEYS.items()}, "status": status, "why": why,
            "check": {"ok": ok, "problems": list(problems)}}


def decisions(model_tp, files=None, overlapped=False):
    """decisions.json as the run writes it, with meta["files"] in the shape answer.py records it."""
    variant = "ub.te+fprop.ring" if overlapped else "none"
    ops = {op: {"op": op, "tp": model_tp, "config": {"variant": "no TP" if model_tp == 1 else variant},
                "winner": {"case": f"{op}-tp2-{variant}"}, "ties": [], "finalists": [], "points": {"2": {}}}
           for op in OPS}
    passed = model_tp > 1
    meta = {"model": "tiny", "model_tp": model_tp, "noise_floor": 0.02, "measurement": {},
            "model_tp_evidence": [{"rule": "hides_communication", "tp": 2, "passed": passed,
                                   "min_hidden_fraction": 0.25,
                                   "reason": "hides 60% [40, 80] of exposed communication" if passed
                                   else "best overlapped setting does not beat no-overlap"}],
            "model_efficiency": (Efficiency(0.6, 0.4, 0.8, 6) if overlapped else Efficiency(0.0, 0.0, 0.0, 9)).to_dict()}
    if files is not None:
        meta["files"] = files
    return {"ops": ops, "meta": meta}


def test_no_tp_chosen_says_to_train_without_tp_and_names_the_per_tp_files(tmp_path):
    """Was: "Model TP: 1" followed by "**Load** `tp_comm_overlap_cfg.yaml`", and "0% [0, 0]"."""
    why = "the layer stage was cut short: not proven on the block"
    files = {"model_tp": 1, "default": None,
             "sets": {"2": {"tp": 2, "files": {"chunked_cfg": "chunked_cfg.tp2.yaml"}, "status": "unproven", "why": why}}}
    s = settings()
    card = answer_card(s, RunDir(tmp_path), decisions(1, files), [])
    assert card["load"] == [] and card["flags"] is None and card["efficiency"] is None
    md = card_markdown(s, RunDir(tmp_path), decisions(1, files), [])
    assert "**Model TP: 1**" in md and "**Train without tensor parallelism (TP 1)**" in md
    assert "**Load**" not in md and "tp_comm_overlap_cfg" not in md
    assert f"- TP 2, unproven ({why}): `chunked_cfg.tp2.yaml`" in md
    assert "0% [0, 0]" not in md and "none to show (every op's fastest setting was no overlap" in md


def test_model_tp_loads_the_default_set_unsuffixed_and_names_the_others(tmp_path):
    files = {"model_tp": 2, "default": "2",
             "sets": {"2": te_set(2, "proven", "won on the block and passed its numerics check"),
                      "4": te_set(4, "unproven", "the layer stage is off")}}
    (tmp_path / "megatron_flags.txt").write_text("# tuned\n--sequence-parallel\n--tp-comm-overlap\n")
    s = settings("te")
    dec = decisions(2, files, overlapped=True)
    card = answer_card(s, RunDir(tmp_path), dec, [])
    assert [f["name"] for f in card["load"]] == UNSUFFIXED
    assert card["flags"] == "--sequence-parallel --tp-comm-overlap"
    assert card["efficiency"].startswith("60% [40, 80]")
    md = card_markdown(s, RunDir(tmp_path), dec, [])
    assert ("**Load** (all in this folder: the TP 2 files, proven on the block: won on the block and passed "
            "its numerics check):") in md
    assert "`tptune check` of these files: ok." in md
    assert "Other TP sizes measured (not files to load for this answer):" in md
    assert "- TP 4, unproven (the layer stage is off): `tp_comm_overlap_cfg.tp4.yaml`, `megatron_flags.tp4.txt`" in md
    assert "**A CPU run.**" not in md


def test_nothing_passed_at_the_model_tp_lists_no_file_to_load(tmp_path):
    files = {"model_tp": 2, "default": None,
             "sets": {"2": te_set(2, "failed", "every overlapped setting failed the numerics check", ok=False,
                                  problems=["qkv_fprop: ring_exchange needs sequence parallelism"])}}
    md = card_markdown(settings("te"), RunDir(tmp_path), decisions(2, files, overlapped=True), [])
    assert "**Train at TP 2 without TP comm overlap**" in md and "**Load**" not in md
    assert "- TP 2, **failed** (every overlapped setting failed the numerics check): `tp_comm_overlap_cfg.tp2.yaml`" in md


@pytest.mark.parametrize("backend", ["te", "torch"])
def test_a_run_recorded_before_meta_files_renders_from_its_folder(tmp_path, backend):
    """No meta["files"] (committed older runs): at a model TP the unsuffixed files in the folder are listed
    as before; at model TP 1 none is to be loaded, and a te run's per-TP files are named (a torch run's
    per-TP yaml holds TE defaults nobody measured, so it is not)."""
    for name in ("tp_comm_overlap_cfg.yaml", "tp_comm_overlap_cfg.tp2.yaml", "ub_cfgs.json", "chunked_cfg.yaml"):
        (tmp_path / name).write_text("{}\n")
    s = settings(backend)
    card = answer_card(s, RunDir(tmp_path), decisions(2, overlapped=True), [])
    want = ["tp_comm_overlap_cfg.yaml", "ub_cfgs.json"] + (["chunked_cfg.yaml"] if backend == "torch" else [])
    assert [f["name"] for f in card["load"]] == want
    md = card_markdown(s, RunDir(tmp_path), decisions(1), [])
    assert "**Load**" not in md and "**Train without tensor parallelism (TP 1)**" in md
    listed = ("- TP 2, not graded (decisions.json lists no files: the layout before tptune graded them): "
              "`tp_comm_overlap_cfg.tp2.yaml`")
    assert (listed in md) == (backend == "te")


def test_tptunes_own_block_combinations_are_never_presets():
    """Was: the FP8 current-scaling run's card called tptune's own fastest_tp2 "best preset"."""
    assert _preset("ub.nemo_tp4") and _preset("ub.nvidia_fp8_tp2")
    assert not any(_preset(v) for v in ("ub.te", "ub.tuned_tp4", "ub.fastest_tp4", "ub.tuned_other_dgrad_tp4",
                                        "ub.te+fprop.ring"))
    run = ROOT / "results" / "fp8-current-llama3-70b-x2"
    dec = json.loads((run / "decisions.json").read_text())
    s = _settings(str(run / "config.json"))
    card = answer_card(s, RunDir(run), dec, [])
    assert card["block"]["best_preset"]["variant"] == "ub.nvidia_fp8_tp2"
    assert [r["variant"] for r in card["block"]["own"]] == ["ub.fastest_tp2"]
    md = card_markdown(s, RunDir(run), dec, [])
    assert "| best preset, `nvidia_fp8_tp2` |" in md and "| tptune's fastest combination, `fastest_tp2` |" in md
    assert "best preset, `fastest" not in md


def test_defaults_adapted_to_the_model_are_named_on_the_card(tmp_path):
    """Issue 34, item 9: the ops the default left out are said on the first screen."""
    s = settings(model=FIXTURES / "hf" / "mixtral-8x7b-v0.1.config.json", workload={"seq_length": 4096},
                 parallel={"memory_check": False})
    dec = decisions(2, overlapped=True)
    dec["ops"] = {op: dec["ops"][op] for op in ("qkv", "proj")}
    md = card_markdown(s, RunDir(tmp_path), dec, [])
    assert "ops: qkv, proj: the default (ops: auto) takes the ops mixtral-8x7b-v0.1.config runs under TP " \
           "overlap; it leaves out fc1, fc2: every layer is an MoE layer without shared experts" in md
    assert "the default (ops: auto)" not in card_markdown(settings(), RunDir(tmp_path), decisions(2, overlapped=True), [])


def test_a_cpu_report_speaks_of_the_cpu_says_the_noise_once_and_the_tps_measured(tmp_path):
    """The whole report of a recorded run, rendered as a CPU run with TP sizes [2, 4] of which only 2 was
    measured. Was: the noise paragraph twice (the card and "How it was measured"), "TP sizes tried from
    [2, 4]", "GPU time" / "GPU·s" on a CPU run."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "fp8-current-llama3-70b-x2", run)
    dec = json.loads((run / "decisions.json").read_text())
    warning = dec["meta"]["measurement"]["warning"]
    dec["meta"]["files"] = {"model_tp": 2, "default": "2", "sets": {"2": te_set(2, "proven", "won on the block")}}
    (run / "decisions.json").write_text(json.dumps(dec))
    s = _settings(str(run / "config.json"))
    s = dataclasses.replace(s, device="cpu", config={**s.config, "tp_sizes": [2, 4]})
    text = render_report(s, RunDir(run), run / "report.md").read_text()
    assert text.count(warning) == 1
    assert "TP sizes measured: 2 of the candidates 2, 4" in text and "tried from" not in text
    assert "GPU time" not in text and "GPU·s" not in text and "GPU-held" not in text
    assert "The files to load (the Answer) are copies of the TP 2 files" in text
    assert "- TP 2, proven on the block (won on the block): `tp_comm_overlap_cfg.tp2.yaml`" in text


def test_no_tp_where_no_layout_fits_is_not_train_without_tp(tmp_path):
    """The overlap rule says TP 1 but the memory check found no layout up to the node that fits (2x H100,
    Llama-3-70B): the card must not tell the user to train without TP."""
    files = {"model_tp": 1, "default": None, "sets": {"2": te_set(2, "proven", "block-level winner at TP 2")}}
    dec = decisions(1, files)
    dec["meta"]["memory"] = {"status": "no_fit", "floor_tp": None, "effective_tp": None,
                             "why": "no TP up to 2 fits, and no TP x PP layout up to PP=80 fits either"}
    s = settings("te")
    md = card_markdown(s, RunDir(tmp_path), dec, [])
    assert "Train without tensor parallelism" not in md
    assert "**No answer for this node's memory**" in md and "no TP x PP layout up to PP=80" in md
    assert "- TP 2, proven" in md

"""The packing example end to end on the CPU (config/packing-example.yaml, docs/packing.md; issue 53): real Snakemake
over the tiny model on the torch backend over gloo, its decisions, then one packed block session per capacity T
beside the native micro-batches, packing.json, each framework's files and the report's first screen. Kept short:
the example's lengths divided by 12 (and its budget), so the capacities are 128 and 256 tokens; one op; 2 rounds."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import base_config, copy_workflow

pytestmark = pytest.mark.slow
RUN = "outputs/packing"


def smk(workdir, *args):
    p = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml", *args],
                       cwd=workdir, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise AssertionError(f"snakemake {args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    w = copy_workflow(tmp_path_factory.mktemp("packing"))
    (w / "pool").mkdir()
    example = yaml.safe_load((w / "config/packing-example.yaml").read_text())
    packing = example["workload"]["packing"]
    lengths = np.loadtxt(w / packing["lengths"], dtype=np.int64, comments="#")
    np.savetxt(w / "lengths-div12.txt", np.maximum(1, lengths // 12), fmt="%d")
    cfg = base_config(w / "pool", run="packing", ops=["qkv"])
    cfg["launcher"]["idle_timeout_s"] = 30          # the layer stage's worker group measures the packed sessions
    cfg.update({k: v for k, v in example.items() if k != "workload"})
    cfg["model"] = example["model"]
    cfg["workload"] = {"packing": {**packing, "lengths": "lengths-div12.txt",
                                   "max_token_len": packing["max_token_len"] // 12}}
    (w / "run.yaml").write_text(yaml.safe_dump(cfg))
    dry = smk(w, "-n")
    smk(w)
    return w, dry.stdout + dry.stderr, cfg


def test_the_dry_run_plans_the_packing_stage_and_its_prediction_counts_the_packed_sessions(finished):
    w, dry, cfg = finished
    assert re.search(r"^(rule|checkpoint) packing_plan:", dry, re.M) and re.search(r"^rule packing_decide:", dry, re.M)
    from tptune.measure.preflight import resolve_here
    from tptune.schedule.plan_estimate import estimate

    planned = int(re.search(r"tptune: predicted wall time .* for (\d+) planned sessions", dry)[1])
    without = {**cfg, "workload": {}}
    assert planned == len(estimate(resolve_here(without, base_dir=w, check_hardware=False), 2).sessions) + 2
    rec = json.loads((w / RUN / "wall_predicted.json").read_text())
    assert rec["sessions_planned"] == planned and any("2 packed block sessions" in n for n in rec["notes"])


def test_one_session_per_capacity_measures_it_beside_the_native_points_in_every_round(finished):
    w, _, _ = finished
    plan = json.loads((w / RUN / "packing/plan.json").read_text())
    assert plan["tp"] == 2 and plan["capacities"] == [128, 256] and plan["settings"]["set"].startswith("chunked")
    for cap in plan["capacities"]:
        sess = json.loads((w / RUN / f"sessions/layer/tp2/pack{cap}/session.json").read_text())
        native = sess["settings"]["packing"]["native"]
        members = set(sess["members"])
        assert {f"layer-tp2-pack{cap}.b0-none", f"layer-tp2-pack{cap}.b0-{plan['settings']['set']}"} <= members
        assert {f"layer-tp2-pack{t}.b{k}-none" for t, k in native} <= members and len(native) == 3
        assert sess["rounds"] == 2 and all(set(order) == members for order in sess["order"]) and not sess["failed"]
        run = json.loads((w / RUN / f"sessions/layer/tp2/pack{cap}/pack{cap}.b0-none/run.json").read_text())
        assert run["pack"]["tokens"] == cap and len(run["timing"]["fwd_only_ms"]["rounds"]) == 2
        # every member's first round checked its numerics (the chunked set on packed input as no overlap)
        for cid, rel in sess["runs"].items():
            member = json.loads((w / RUN / f"sessions/layer/tp2/pack{cap}" / rel).read_text())
            assert member["correctness"]["ok"] is True and not member.get("traces"), cid


def test_packing_json_and_the_framework_files(finished):
    w, _, _ = finished
    p = json.loads((w / RUN / "packing.json").read_text())
    assert p["verdict"] in ("on", "off", "undecided") and p["capacity"] in (128, 256) and not p["problems"]
    assert p["sentence"] == p["decision"]["sentence"] and f"T = {p['capacity']}" in p["sentence"]
    for c in p["decision"]["capacities"]:
        for k in ("vs_native", "padding_cost", "overlap"):
            assert c[k]["rounds"] == 2 and c[k]["paired"] and c[k]["lo"] <= c[k]["ratio"] <= c[k]["hi"]
        assert 0 < c["padding_share"] < 1 and c["ub_bytes"] > 0
    assert len(p["native"]["fit"]["tokens"]) == 3 and p["native"]["fit"]["residual"] >= 0
    assert p["memory"]["ub_gib"][str(p["capacity"])] >= 0 and p["memory"]["headroom_bytes"] > 0
    assert {f["framework"]: f["ready"] for f in p["frameworks"]} == {"megatron_lm": True, "megatron_rl": True,
                                                                    "slime": True, "verl": False}
    assert all(not f["option_problems"] for f in p["frameworks"])
    assert p["files"] == {"megatron_lm": "packing/megatron_lm.txt", "megatron_rl": "packing/megatron_rl.txt",
                          "slime": "packing/slime.txt", "verl": "packing/verl.yaml"}   # torch: no TE yaml
    lm = (w / RUN / "packing/megatron_lm.txt").read_text().splitlines()
    assert f"--seq-length {p['capacity']}" in lm and "--micro-batch-size 1" in lm
    verl = yaml.safe_load((w / RUN / "packing/verl.yaml").read_text())
    assert verl["actor_rollout_ref"]["actor"]["ppo_max_token_len_per_gpu"] == p["capacity"]


def test_the_reports_first_screen_states_the_answer_in_one_sentence(finished):
    w, _, _ = finished
    p = json.loads((w / RUN / "packing.json").read_text())
    report = (w / RUN / "report.md").read_text()
    first = report.splitlines()[:16]
    assert any(p["sentence"] in line and line.startswith("**Packed micro-batches** (TP 2") for line in first)
    section = report[report.index("## Packed micro-batches"):report.index("## How it was measured")]
    assert f"| {p['capacity']} (chosen) |" in section and len(re.findall(r"^\| (128|256)( \(chosen\))? \|", section, re.M)) == 2
    assert "**veRL (Megatron engine) cannot hold a fixed token count today**" in section
    assert "The native batching's fit" in section and "**Memory**" in section
    assert json.loads((w / RUN / "status.json").read_text())


def test_a_second_run_measures_nothing_again(finished):
    """The packed sessions' params are the run config's alone (bins and native points drawn by seed): a rerun keeps
    them, and its dry run counts them measured."""
    w, _, _ = finished
    p = smk(w, "-n")
    out = p.stdout + p.stderr
    assert "Nothing to be done" in out and "for 0 planned sessions" in out
    assert re.search(r"; 6 already measured with these settings, not counted", out)   # qkv's 3, the block, 2 packed

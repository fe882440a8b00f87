"""The workflow for real on the tiny MoE model (config/models/tiny-moe.yaml) on CPU (gloo): the report
shows the attention and fc1 choices (fc1 measured at the dense and shared-expert shapes, per shape), names the routed experts as outside TP overlap, and its
layer stage is built with experts."""
import json

import pytest
import yaml

from conftest import base_config, copy_workflow
from test_workflow_e2e import smk

pytestmark = pytest.mark.slow


def test_tiny_moe_end_to_end(tmp_path):
    copy_workflow(tmp_path)
    pool = tmp_path / "pool"
    pool.mkdir()
    cfg = base_config(pool, run="moe", ops=["qkv", "fc1"], tp_sizes=[2], search={"chunks": [2]})
    cfg["model"] = "config/models/tiny-moe.yaml"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    smk(tmp_path)
    run = tmp_path / "outputs/moe"
    report = (run / "report.md").read_text()
    decisions = json.loads((run / "decisions.json").read_text())
    assert set(decisions["ops"]) == {"qkv", "fc1"}          # attention and shared-expert choices
    assert "| qkv | " in report and "| fc1 | " in report
    assert "| mlp.shared_experts.linear_fc1 | [256, 512] | 1 | 3 | yes (fc1)" in report
    assert "| mlp.experts.linear_fc1 (routed) | [256, 256] | 4 | 3 | no: routed experts" in report
    assert "run outside TP comm overlap" in report
    assert "fc1 runs at 2 shapes under one communicator config" in report and "shared expert [256, 512] in 3 layers (75%" in report
    # fc1 runs at two shapes under one config: each case measured at both, chosen on the mix, shown per shape
    assert "| fc1 | 2 | dense MLP | [256, 1536] | 1 | " in report and "| fc1 | 2 | shared expert | [256, 512] | 3 | " in report
    assert "| qkv | 2 | attention |" not in report                  # one shape: no per-shape rows
    runs = [json.loads(p.read_text()) for p in run.glob("sessions/fc1/tp2/point/*/run.json")]
    assert runs and all([(s["what"], s["share"]) for s in r["shapes"]] == [("dense MLP", 0.25), ("shared expert", 0.75)]
                        and len(s["total_ms"]) == len(r["timing"]["total_ms"]["rounds"]) for r in runs for s in r["shapes"])
    assert all("shapes" not in json.loads(p.read_text()) for p in run.glob("sessions/qkv/tp2/point/*/run.json"))
    layer = json.loads((run / "layer/tp2.json").read_text())
    assert layer["built"][0].startswith("dense") and layer["built"][1].startswith("MoE (attention + router + 4 routed")
    assert "Layers built: 1: dense (attention + MLP); 2: MoE (attention + router + 4 routed experts, top-2" in report

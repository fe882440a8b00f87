"""The workflow for real on the tiny MoE model (config/models/tiny-moe.yaml) on CPU (gloo): the report
shows the attention and shared-expert choices, names the routed experts as outside TP overlap, and its
layer stage is built with experts."""
import json

import pytest
import yaml

from conftest import base_config
from test_workflow_e2e import smk

pytestmark = pytest.mark.slow


def test_tiny_moe_end_to_end(tmp_path):
    import shutil
    from conftest import ROOT
    for name in ("Snakefile", "rules", "config", "profiles", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
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
    layer = json.loads((run / "layer/tp2.json").read_text())
    assert layer["built"][0].startswith("dense") and layer["built"][1].startswith("MoE (attention + router + 4 routed")
    assert "Layers built: 1: dense (attention + MLP); 2: MoE (attention + router + 4 routed experts, top-2" in report

"""`tptune rederive` follows the TP sizes the workflow would measure after a config change (issue 54 item 9):
the decision chain from the first of tp_sizes, each decision's next (rules/common.smk tp_chain), not every TP
folder a run holds. A committed TP 2 + 4 run re-derived with tp_sizes: [2]; before, its TP 4 sessions decided
every op and the model TP as if measured under this config."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import ROOT

RUN = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"


def test_a_tp_dropped_from_tp_sizes_is_left_out_as_the_workflow_leaves_it(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["tp_sizes"] == [2, 4]
    (run / "config.json").write_text(json.dumps({**cfg, "tp_sizes": [2]}))
    p = subprocess.run([sys.executable, "-m", "tptune", "rederive", str(run)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    finals = {f.parent.name: json.loads(f.read_text()) for f in sorted((run / "search").glob("*/final.json"))}
    assert len(finals) == 4
    assert all(f["measured_tps"] == [2] for f in finals.values()), {op: f["measured_tps"] for op, f in finals.items()}
    meta = json.loads((run / "decisions.json").read_text())["meta"]
    assert set(meta.get("layer") or {}) == {"2"}, list(meta.get("layer") or {})
    # Llama-3-70B needs TP 4 for memory on this node: the answer is then to measure it, not a TP 4 setting
    floor = [e for e in meta["model_tp_evidence"] if e.get("rule") == "memory_floor"]
    assert meta["model_tp"] <= 2 or (floor and floor[0]["measured"] is False), meta["model_tp_evidence"]

"""Each framework's settings at T as files users load (emit.packing, issue 53): Megatron's one flag (with its value) a
line, veRL's overrides as nested YAML that reads back to them, and a framework that cannot hold T says so and what it
takes; a decision without a capacity removes what an earlier one wrote."""
from __future__ import annotations

import json
import shlex

import yaml

from tptune.emit.packing import CFG_NAME, write_packing
from tptune.packing import emit as frameworks
from tptune.records.run_dir import RunDir


def test_files_load_as_they_are_and_a_new_decision_replaces_them(tmp_path):
    run = RunDir(tmp_path)
    fws = frameworks.all_settings(8192, 4, CFG_NAME, ["--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad",
                                                      "--tp-comm-overlap-cfg", "tp_comm_overlap_cfg.tp4.yaml"],
                                  {"tp_comm_overlap": True, "tp_comm_overlap_rs_dgrad": True})
    files = write_packing(run, {"verdict": "on", "capacity": 8192}, fws, ["the answer"], "qkv_fprop: {}\n")
    assert set(files) == {"megatron_lm", "megatron_rl", "slime", "verl", "tp_comm_overlap_cfg"}
    lines = (tmp_path / files["slime"]).read_text().splitlines()
    args = [tok for ln in lines if not ln.startswith("#") for tok in shlex.split(ln)]
    assert args == list(fws[2].args) and "--max-tokens-per-gpu 8192" in lines and "--data-pad-size-multiplier 2048" in lines
    assert "--tp-comm-overlap-cfg tp_comm_overlap_cfg.yaml" in lines and (tmp_path / "packing" / CFG_NAME).is_file()
    assert "# the answer" in lines and "# Ready as it is: these settings hold every micro-batch at T." in lines
    verl = (tmp_path / files["verl"]).read_text()
    assert "# NOT READY" in verl and "initialize_ub" in verl and "rearrange_micro_batches" in verl

    def flat(d, pre=""):
        return {k2: v2 for k, v in d.items() for k2, v2 in
                (flat(v, f"{pre}{k}.").items() if isinstance(v, dict) else {f"{pre}{k}": v}.items())}
    assert flat(yaml.safe_load(verl)) == fws[3].overrides
    assert json.loads(run.packing_json.read_text())["files"] == files
    write_packing(run, {"verdict": "unmeasured", "capacity": None}, [], [], None)
    assert sorted(p.name for p in (tmp_path / "packing").iterdir()) == []
    assert json.loads(run.packing_json.read_text())["files"] == {}

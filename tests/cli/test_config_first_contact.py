"""A run config a new user gets slightly wrong is answered with what to do (issue 54 item 9): a mistyped key is
named with the key it was likely meant as, and a model file given to snakemake as --configfile gets
`tptune validate`'s hint (`model: <file>`), not one "unknown key" line per model field."""
from __future__ import annotations

import subprocess
import sys

import yaml

from conftest import copy_workflow


def _run(cwd, *args):
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return p


def test_a_mistyped_key_is_named_with_the_one_it_was_meant_as(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"tp_size": [2], "timing": {"iter": 3},
                                                      "launcher": {"cpu_slot": 2}}))
    p = _run(tmp_path, "-m", "tptune", "validate", "run.yaml")
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "field 'tp_size': unknown key (did you mean 'tp_sizes'?" in out, out
    assert "field 'timing.iter': unknown key (did you mean 'iters'?" in out, out
    assert "field 'launcher.cpu_slot': unknown key (did you mean 'cpu_slots'?" in out, out


def test_a_model_file_given_as_configfile_gets_the_model_hint(tmp_path):
    copy_workflow(tmp_path)
    p = _run(tmp_path, "-m", "snakemake", "-n", "--configfile", "config/models/tiny.yaml")
    out = p.stdout + p.stderr     # snakemake says a WorkflowError on stdout
    assert p.returncode != 0
    assert "this is a model file, not a run config: name it in a run config as `model: config/models/tiny.yaml`" \
        in out, out[-3000:]
    assert "unknown key" not in out, out[-3000:]

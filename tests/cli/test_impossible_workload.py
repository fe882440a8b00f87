"""A workload no TP of the run can measure is refused before any job (issue 47 item 2): one transformer
layer's activations alone exceed a GPU's memory (the run's memory section, tptune.model.memory). Before:
`validate` and `snakemake -n` passed, then every member of every stage failed allocating terabytes."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml

from conftest import ROOT, copy_workflow

TPTUNE = [sys.executable, "-m", "tptune"]


def test_the_issue_s_workload_is_refused_by_validate_and_before_any_job(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(
        {"run": "huge", "workload": {"seq_length": 1_000_000_000, "micro_batch_size": 1_000_000}}))
    v = subprocess.run([*TPTUNE, "validate", "run.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert v.returncode == 2 and "Traceback" not in v.stderr, v.stderr
    assert ("field 'workload': seq_length=1,000,000,000 x micro_batch_size=1,000,000 (1,000,000,000,000,000 tokens "
            "a micro-batch) cannot be measured at TP sizes 2, 4: one transformer layer's activations alone need") \
        in v.stderr, v.stderr
    assert "Lower seq_length x micro_batch_size to at most about" in v.stderr
    for dry in ([], ["-n"]):
        p = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "run.yaml", *dry],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "cannot be measured at TP sizes 2, 4" in p.stdout + p.stderr
    assert not (tmp_path / "outputs").exists()


def test_the_tp_sizes_that_fit_are_named(tmp_path):
    """Llama-3-70B at 1M tokens on an 80 GB GPU (hardware.gpu_memory_gb, so the verdict is this machine's
    no matter where the test runs): one layer at TP 2 needs more than the GPU; TP 8 holds it."""
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(
        {"model": "config/models/llama3-70b.yaml", "backend": "torch", "tp_sizes": [2, 8],
         "hardware": {"gpu_memory_gb": 79.1}, "workload": {"seq_length": 1 << 20}}))
    env = {**os.environ, "TPTUNE_SUBMIT_ONLY": "1"}
    v = subprocess.run([*TPTUNE, "validate", str(tmp_path / "run.yaml")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert v.returncode == 2, v.stderr
    assert "cannot be measured at TP=2: one transformer layer's activations alone need" in v.stderr
    assert "above the 71.2 GiB usable (90% of 79.1 GiB, hardware.gpu_memory_gb)" in v.stderr
    assert "TP 8 fits: leave TP 2 out of tp_sizes, or lower seq_length x micro_batch_size" in v.stderr
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(
        {"model": "config/models/llama3-70b.yaml", "backend": "torch", "tp_sizes": [8],
         "hardware": {"gpu_memory_gb": 79.1}, "workload": {"seq_length": 1 << 20}}))
    v = subprocess.run([*TPTUNE, "validate", str(tmp_path / "run.yaml")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert v.returncode == 0, v.stderr

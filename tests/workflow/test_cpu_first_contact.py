"""What a new user meets on a machine without GPUs (issue 54 item 9), through `snakemake -n` and `tptune
validate` as a user runs them: a model far larger than the CPU default is warned about and priced by its size
(an 8B model was promised 218 s and takes hours), and `--resources gpus=8` beside a pool of 2 worker slots is
named."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from conftest import FIXTURES, ROOT, copy_workflow

from tptune.measure.gpupool import available_ids
from tptune.measure.preflight import cpu_notes, resolve_here
from tptune.settings.resolve import load_config_files

pytestmark = pytest.mark.skipif(bool(available_ids()), reason="GPUs here: the run would measure on them")


def _run(cwd, *args):
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return p


def _big(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "Llama-3.1-8B").mkdir()
    (tmp_path / "Llama-3.1-8B" / "config.json").write_text((FIXTURES / "hf" / "llama-3.1-8b.config.json").read_text())
    (tmp_path / "big.yaml").write_text(yaml.safe_dump({"model": "Llama-3.1-8B/config.json",
                                                       "workload": {"seq_length": 8192}, "tp_sizes": [2],
                                                       "launcher": {"cpu_slots": 2}}))


def test_a_model_far_larger_than_the_cpu_default_is_warned_and_priced_by_its_size(tmp_path):
    _big(tmp_path)
    p = _run(tmp_path, "-m", "snakemake", "-n", "--cores", "2", "--configfile", "big.yaml")
    assert p.returncode == 0, p.stderr[-3000:]
    warned = [ln for ln in p.stderr.splitlines() if "the CPU path" in ln]
    assert len(warned) == 1 and re.search(r"1109× the CPU default's", warned[0]), p.stderr[-3000:]
    pred = re.search(r"predicted wall time on this node \(2 worker slots[^)]*\): (\d+) s", p.stderr)
    assert pred and int(pred.group(1)) > 10 * 3600, p.stderr[-3000:]
    v = _run(tmp_path, "-m", "tptune", "validate", "big.yaml")
    assert v.returncode == 0 and "1109× the CPU default's" in v.stdout, v.stdout + v.stderr


def test_gpu_resources_beyond_the_cpu_pool_are_named(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"launcher": {"cpu_slots": 2}}))
    p = _run(tmp_path, "-m", "snakemake", "-n", "--cores", "8", "--resources", "gpus=8", "--configfile", "run.yaml")
    assert p.returncode == 0, p.stderr[-3000:]
    note = [ln for ln in p.stderr.splitlines() if "--resources gpus=8" in ln]
    assert len(note) == 1 and "no GPU here" in note[0] and "2 CPU worker slots" in note[0], p.stderr[-3000:]
    # the CPU default with as many GPUs as slots: nothing to say
    s = resolve_here({**load_config_files(ROOT / "config" / "config.yaml"), "launcher": {"cpu_slots": 2}},
                     base_dir=ROOT, check_hardware=False)
    assert cpu_notes(s, 2) == [] and cpu_notes(s, None) == []

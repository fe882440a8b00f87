"""The dry run's estimate counts what is left to measure (issue 54 item 9): a run whose TP 2 sessions are all
recorded, with the settings the workflow would measure them with now, is predicted for the rest. The
committed CPU run (tests/fixtures/cpu/tiny-default) placed as the default run's folder."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, copy_workflow

from tptune.measure.gpupool import available_ids

pytestmark = pytest.mark.skipif(bool(available_ids()), reason="GPUs here: the default run would be another")


def _line(cwd):
    p = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "2"], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return next(ln for ln in p.stderr.splitlines() if ln.startswith("tptune: predicted wall time"))


def test_sessions_already_measured_are_not_counted_again(tmp_path):
    """Before: 218 s for 26 planned sessions (TP 2 13, TP 4 13), as for a run with nothing measured."""
    copy_workflow(tmp_path)
    shutil.copytree(FIXTURES / "cpu" / "tiny-default", tmp_path / "outputs" / "tiny-s512-b1-fp32-torch")
    left = _line(tmp_path)
    m = re.search(r"(\d+) s for (\d+) planned sessions \(([^)]*)\)", left)
    assert m and m.group(2) == "13" and "TP 2" not in m.group(3) and "13 already measured" in left, left

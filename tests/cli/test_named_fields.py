"""Every config field that names a case, a rank or an op is checked against what the run measures before
anything runs (issue 47 item 8): before, a test aid naming a case the run never measures was accepted and
silently never fired."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

TPTUNE = [sys.executable, "-m", "tptune"]


def _validate(tmp_path, over):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"tp_sizes": [2], **over}))
    return subprocess.run([*TPTUNE, "validate", str(tmp_path / "run.yaml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("over, expect", [
    ({"faults": {"qkv-tp2-none": "raise:5"}},
     "field 'faults.qkv-tp2-none' = 'raise:5': rank 5 is not in a TP=2 group (ranks 0 to 1)"),
    ({"faults": {"qkv-tp1-nocomm": "hang:1"}},
     "field 'faults.qkv-tp1-nocomm' = 'hang:1': rank 1 is not in a TP=1 group (ranks 0 to 0)"),
    ({"search": {"chunks": [2, 4]}, "faults": {"fc1-tp2-chunked.n8": "raise:0"}},
     "field 'faults.fc1-tp2-chunked.n8': this run measures no chunk count 8 (search.chunks: [2, 4])"),
    ({"faults": {"qkv-tp2-ub.te+dgrad.bulk.sm8": "raise:0"}},
     "field 'faults.qkv-tp2-ub.te+dgrad.bulk.sm8': the torch backend measures no userbuffers setting"),
    ({"faults": {"qkv-tp2-chunked": "raise:0"}}, "field 'faults.qkv-tp2-chunked': unknown variant 'chunked'"),
    ({"ops": ["qkv"], "op_settings": {"fc1": {"timing": {"iters": 3}}}},
     "field 'op_settings.fc1': fc1 is not among the ops this run tunes (qkv): its settings would never apply"),
])
def test_a_field_naming_what_the_run_never_measures_is_refused(tmp_path, over, expect):
    p = _validate(tmp_path, over)
    assert p.returncode == 2 and expect in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_the_faults_the_workflow_tests_plant_are_accepted(tmp_path):
    """Its own op/TP cases at every chunk count it searches, the layer stage's, TP 1's (the window
    calibration) and a rank inside the group."""
    faults = {"fc2-tp2-chunked.n4": "raise:1", "layer-tp2-chunked.n2": "raise:0", "layer-tp2-none": "exit:0",
              "qkv-tp1-nocomm": "hang:0", "qkv-tp2-none": "corrupt_dgrad:1"}
    p = _validate(tmp_path, {"search": {"chunks": [2, 4]}, "faults": faults})
    assert p.returncode == 0, p.stderr

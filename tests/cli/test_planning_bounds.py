"""Planning never hangs on a huge number (issue 47 item 3): the layer count is counted, never listed per
layer, and every size a config or model file gives has an upper bound far above any real one, refused in
one line naming the field (before: num_layers 1e9 hung `tptune validate` and `snakemake -n`; 1e11 was a
MemoryError traceback; killed, validate said a "case in flight" was stopped)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, copy_workflow
from tptune.cli import main as cli_main
from tptune.model.memory import smallest_layout, tp_floor
from tptune.model.spec import load_model

TPTUNE = [sys.executable, "-m", "tptune"]


def _model(tmp_path, **fields):
    raw = yaml.safe_load((ROOT / "config/models/tiny.yaml").read_text())
    raw.update(fields)
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "big.yaml"


@pytest.mark.parametrize("layers", [10**9, 10**11])
def test_a_huge_layer_count_is_refused_at_once(tmp_path, layers):
    _model(tmp_path, num_layers=layers)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": "big.yaml"}))
    copy_workflow(tmp_path)
    for cmd in ([*TPTUNE, "validate", "run.yaml"],
                [sys.executable, "-m", "snakemake", "-n", "--configfile", "run.yaml"]):
        p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        out = p.stdout + p.stderr
        assert p.returncode != 0 and "Traceback" not in out, out[-2000:]
        assert f"field 'num_layers' = {layers}: expected at most 100,000" in out, out[-2000:]


def test_the_memory_estimate_counts_layers_without_a_list_per_layer(tmp_path):
    """At the bound (100,000 layers; an MoE pattern every other layer) the layer counts, the estimate, the
    floor and the search for a pipeline layout over the divisors of the layer count take milliseconds."""
    mc = load_model(_model(tmp_path, num_layers=100_000))
    assert (mc.model.dense_layers, mc.model.moe_layers) == (100_000, 0)
    t0 = time.perf_counter()
    floor = tp_floor(mc, [2, 4], gpu_memory_bytes=2**30)
    smallest_layout(mc, None, 2**30)
    assert floor["status"] in ("fits", "no_fit") and time.perf_counter() - t0 < 2
    moe = load_model(ROOT / "config/models/qwen3-30b-a3b.yaml").model
    for n in (7, 48):
        assert moe.moe_layers_in(0, n) == sum(moe.moe_pattern()[:n])


@pytest.mark.parametrize("over, expect", [
    ({"layer": {"num_layers": 10**9}}, "field 'layer.num_layers': 1000000000 is more than the maximum of 64"),
    ({"timing": {"iters": 10**12}}, "field 'timing.iters': 1000000000000 is more than the maximum of 1000000"),
    ({"op_settings": {"fc1": {"timing": {"max_rounds": 10**6}}}},
     "field 'op_settings.fc1.timing.max_rounds': 1000000 is more than the maximum of 10000"),
    ({"tp_sizes": [2, 2**40]}, "field 'tp_sizes.1': 1099511627776 is more than the maximum of 1024"),
])
def test_config_sizes_have_upper_bounds(tmp_path, over, expect):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(over))
    p = subprocess.run([*TPTUNE, "validate", str(tmp_path / "run.yaml")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and expect in p.stderr, p.stderr


@pytest.mark.parametrize("cmd, words", [("validate", "interrupted (SIGTERM); nothing was being measured"),
                                         ("layer", "the case in flight was stopped with its worker group")])
def test_an_interrupted_command_speaks_of_a_case_in_flight_only_where_it_measures(monkeypatch, capsys, cmd, words):
    """The signal arrives while the command runs (the interrupt stands in for SIGTERM's handler); what main
    says of it is the code under test."""
    def interrupted(argv):
        raise KeyboardInterrupt(signal.SIGTERM)

    monkeypatch.setattr(cli_main, "_dispatch", interrupted)
    assert cli_main.main([cmd, "x"]) == 128 + signal.SIGTERM
    assert words in capsys.readouterr().err

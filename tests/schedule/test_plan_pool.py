"""The plan is laid on the worker pool the run measures on (issue 54 item 9): on CPU the pool holds the cores
this process may run on, at most launcher.cpu_slots, not gpus_per_node's 8; a TP larger than the pool holds
all of it, as the launcher runs it."""
from __future__ import annotations

from conftest import ROOT

from tptune.cli.wall import dry_run_line
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_config_files


def _cpu_default(**launcher):
    cfg = load_config_files(ROOT / "config" / "config.yaml")
    cfg["launcher"].update(launcher)
    return resolve_here(cfg, base_dir=ROOT, check_hardware=False)


def test_a_cpu_plan_is_laid_on_the_pools_worker_slots():
    """launcher.cpu_slots: 2, so the pool has 2 slots on any machine of 2 cores or more. Before: "8 worker
    slots" (gpus_per_node), and TP 4 could not be laid on 2 slots at all."""
    s = _cpu_default(cpu_slots=2)
    assert s.device == "cpu" and s.tp_sizes == [2, 4] and s.gpus_per_node == 8
    line = dry_run_line(s)
    assert "(2 worker slots;" in line and "8 worker slots" not in line, line
    assert "TP 2 13, TP 4 13" in line, line

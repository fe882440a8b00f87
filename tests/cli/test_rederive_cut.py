"""tptune rederive on a run cut short (issue 47 item 4): a clear line naming what is missing, never a
traceback (before: UnboundLocalError on a run cut before its first search step)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from tptune.settings.resolve import load_config_files

RUN = ROOT / "results" / "knobs-mixtral-8x7b-h200x2"


def _rederive(run):
    return subprocess.run([sys.executable, "-m", "tptune", "rederive", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("recorded", ["cpu", "gpu"])
def test_a_run_cut_before_its_first_search_step(tmp_path, recorded):
    """The CPU default's config.json as the workflow writes it (rules/common.smk RESOLVED_CONFIG), and a GPU
    run's (before: the memory floor asked for hardware.gpu_memory_gb, which no session had recorded yet)."""
    run = tmp_path / "cut"
    (run / "sessions").mkdir(parents=True)
    if recorded == "cpu":
        cfg = {**load_config_files(ROOT / "config/config.yaml"), "_base_dir": str(ROOT), "_source": "run config"}
        (run / "config.json").write_text(json.dumps(cfg))
    else:
        shutil.copy(RUN / "config.json", run)
    p = _rederive(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert (f"{run}: qkv has no search step recorded ({run}/search/qkv is missing or empty): the run was cut "
            "before its first search step, so there is nothing to re-derive") in p.stderr, p.stderr


def test_a_run_cut_before_a_tp_point(tmp_path):
    run = tmp_path / "cut"
    shutil.copytree(RUN, run)
    shutil.rmtree(run / "sessions/proj/tp2/point")
    p = _rederive(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"{run}: proj TP=2 has no TP point session recorded ({run}/sessions/proj/tp2/point/session.json " \
           "is missing): the run was cut before it" in p.stderr, p.stderr


def test_new_decisions_that_go_on_to_an_unmeasured_tp(tmp_path):
    """The CPU default's recorded run measured TP 2 only; re-derived with every TP of tp_sizes explored, the
    decisions would go on to TP 4: a clear line (before: KeyError 'chosen_tp')."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "cpu" / "tiny-default", run)
    cfg = json.loads((run / "config.json").read_text())
    assert sorted(cfg["tp_sizes"]) == [2, 4]
    cfg["decision"]["explore_all_tps"] = True
    (run / "config.json").write_text(json.dumps(cfg))
    p = _rederive(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "the new decisions go on to TP=4 after TP=2, which the run did not measure" in p.stderr, p.stderr


def _edit_run_json(path, **fields):
    rec = json.loads(path.read_text())
    rec.update(fields)
    path.write_text(json.dumps(rec))


@pytest.mark.parametrize("edit, says", [
    (lambda run: (run / "sessions/qkv/tp2/point/session.json").write_text(
        (run / "sessions/qkv/tp2/point/session.json").read_text()[:100]),
     "sessions/qkv/tp2/point/session.json: not JSON (Expecting"),
    (lambda run: _edit_run_json(run / "sessions/qkv/tp2/point/chunked.n2/run.json", tp=4),
     "sessions/qkv/tp2/point/chunked.n2/run.json: field 'tp': 4, but the session measures TP 2"),
], ids=["truncated-session-json", "tp4-member-in-a-tp2-session"])
def test_a_malformed_record_is_refused_in_one_line_naming_its_file_and_field(tmp_path, edit, says):
    """Issue 54 item 4, through the CLI on the committed CPU run: a truncated session.json was a JSONDecodeError
    traceback; a member claiming TP 4 in a TP 2 session was merged into the TP 2 tables (exit 0)."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "cpu" / "tiny-default", run)
    edit(run)
    p = _rederive(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr

"""report.md's first screen says settings in words (issue 47, "the house"): no long case id before "## How it was
measured" (they stay in the evidence tables below), and the driver version once, not once per GPU per line."""
import json
import re
from pathlib import Path

import pytest

from tptune.cli.main import _settings
from tptune.records.run_dir import RunDir
from tptune.report.render import card_markdown, driver_words

RESULTS = Path(__file__).parents[2] / "results"
# every committed tuning run tptune rederive re-derives (scripts/rederive_all.sh)
RUNS = sorted(p.parent for p in RESULTS.rglob("config.json")
              if (p.parent / "decisions.json").is_file() and (p.parent / "sessions").is_dir())
# a case or variant id: [<op>-tp<N>-]ub.<preset>[+<gemm>.<method>[.<knob><int>]...]... or chunked.n<N>
CASE_ID = re.compile(r"(?:[a-z0-9]+-tp\d+-)?(?:ub\.[a-z0-9_]+(?:\+[a-z]+(?:\.[a-z]+\d*)+)*|chunked\.n\d+)")
LONGEST = 40


def _long_ids(text: str) -> list[str]:
    return [m.group(0) for m in CASE_ID.finditer(text) if len(m.group(0)) > LONGEST]


def test_the_committed_runs_are_all_here():
    assert len(RUNS) >= 29 and RESULTS / "tp24-llama3-70b-h200x4" / "rep1" in RUNS


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_the_answer_card_names_no_long_case_id(run):
    decisions = json.loads((run / "decisions.json").read_text())
    card = card_markdown(_settings(str(run / "config.json")), RunDir(run), decisions, [])
    assert not _long_ids(card)


def test_the_committed_reports_first_screens_name_no_long_case_id():
    """The re-derived report.md of every committed run, up to "## How it was measured" (the answer card, its
    summary table and the confirm stage's section); the evidence tables below keep the ids."""
    for run in RUNS:
        head, sep, rest = (run / "report.md").read_text().partition("## How it was measured")
        assert sep, run
        assert not _long_ids(head), (run, _long_ids(head))
    assert _long_ids(rest)      # the case ids are still there, further down


def test_the_tp24_card_says_the_settings_in_words():
    text = (RESULTS / "tp24-llama3-70b-h200x4" / "rep1" / "report.md").read_text().split("## How it was measured")[0]
    assert ("Per op (TP 4): qkv and fc1: ring exchange for every GEMM, reduce-scatter inside dgrad. "
            "proj and fc2: ring exchange for every GEMM.") in text
    assert ("the file holds the tuned combination (no reference beats the tuned combination on the block beyond the "
            "noise): ring exchange for every GEMM, reduce-scatter inside dgrad.") in text


def test_the_driver_version_is_said_once():
    assert driver_words("580.159.04\n580.159.04\n580.159.04\n580.159.04") == "driver 580.159.04"
    assert driver_words("580.159.04") == "driver 580.159.04"
    assert driver_words("580.159.04\n575.57.08\n") == "drivers GPU 0 580.159.04, GPU 1 575.57.08"
    assert driver_words(None) == "driver ?"
    line = next(ln for ln in (RESULTS / "defaults-mistral-small-24b-h100x4" / "report.md").read_text().splitlines()
                if ln.startswith("Backend **te**"))
    assert line.endswith("NCCL 2.28.9, driver 580.159.04).")

"""The progress line's total never jumps unexplained (issue 54 item 9): the prediction counts every TP of
tp_sizes, an upper bound where the TP decision may stop early, so the line says "at most" while it counts with
it, and says why the total fell once the searches are over. Before: 12/26 ... then 13/13."""
from __future__ import annotations

import json

from tptune.cli.progress import estimate, line
from tptune.records import progress
from tptune.records.run_dir import RunDir
from tptune.search.ahead import Ahead

T0 = 1_700_000_000.0
UPPER = ["every TP of [2, 4] counted for every op (an upper bound: the TP decision may stop earlier)"]


def _run(tmp_path, n):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    progress.record_start(run, now=T0)
    for k in range(n):
        progress.record_session(run, f"qkv/tp2/knobs/step{k}", {"tp": 2, "started": T0 + 10 * k, "wall_s": 9.0},
                                now=T0 + 10 * k + 9)
    run.wall_predicted_json.write_text(json.dumps({"gpus": 2, "sessions_planned": 26, "predicted_wall_s": 260,
                                                   "basis": "test", "notes": UPPER}))
    return run


def test_a_total_that_counts_every_tp_says_at_most(tmp_path):
    run = _run(tmp_path, 3)
    est = estimate(run, Ahead(frozenset({"qkv/tp2/point"}), False), now=T0 + 30)
    assert (est.done, est.planned) == (3, 26)
    assert line("qkv/tp2/knobs/step2", 9.0, est).startswith("tptune: session 3 of at most 26 done (")


def test_the_total_falling_at_the_end_is_explained(tmp_path):
    run = _run(tmp_path, 13)
    est = estimate(run, Ahead(frozenset(), True), now=T0 + 130)
    text = line("layer/tp2", 9.0, est)
    assert text.startswith("tptune: session 13/13 done ("), text
    assert "no session left (the TP decision needed 13 of the at most 26 sessions the plan counted)" in text, text

"""benchmarks/lead_in.py end to end on CPU: real sessions through the tuning harness, each session's effect
read from its members' run.json (typed points) in the order the session recorded."""
import json
import subprocess
import sys

import pytest

from tptune.stats.window import first_member_effect

from conftest import ROOT


def test_lead_in_benchmark_runs_sessions_and_reads_their_points(tmp_path):
    out = tmp_path / "lead-in.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/lead_in.py"), "--reps", "1", "--rounds", "3",
                        "--ops", "qkv", "--gap-s", "0", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "first member's round-0 effect" in p.stdout
    rec = json.loads(out.read_text())
    assert {s["arm"] for s in rec["sessions"]} == {"lead-in", "none"}
    for s in rec["sessions"]:
        rounds = {cid: {int(k): v for k, v in r.items()} for cid, r in s["rounds"].items()}
        second = next(cid for cid in rounds if cid != s["first"])
        assert len(rounds[s["first"]]) == 3
        assert s["effect"] == pytest.approx(first_member_effect(rounds[s["first"]], rounds[second]))
        assert (s["lead_in"] is not None) == (s["arm"] == "lead-in")

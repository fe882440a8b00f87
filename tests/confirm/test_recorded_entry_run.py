"""The launch records of the training entry's first GPU run (results/confirm-entry-h200-tp1) are what this code
makes of its logs and GPU timing: confirm.launch.launch_result on the recorded log and timing gives the recorded
iteration times, and the fork mode and the launch costs its README quotes are in the records."""
import json

from conftest import ROOT
from tptune.confirm.launch import launch_result

RUN = ROOT / "results" / "confirm-entry-h200-tp1"


def test_recorded_launches_are_what_the_code_reads_from_their_logs():
    recs = json.loads((RUN / "smoke.json").read_text())
    for i, name in ((0, "launch0.log"), (4, "launch4.log")):
        rec = recs[i]
        got = launch_result((RUN / name).read_text(), setting=rec["setting"], round_=rec["round"], position=0,
                            rc=0, timed_out=False, timeout_s=240, wall_s=rec["wall_s"], log=rec["log"], iters=20,
                            timed_from=5, timing=rec["timing"])
        assert got.status == "ok" and got.gpu_ms == rec["gpu_ms"] and got.log_ms == rec["log_ms"]
        assert got.iteration_ms == rec["gpu_ms"] and abs(got.log_ms / got.gpu_ms - 1) < 0.002
    plain = [r["gpu_ms"] for r in recs[:4]]
    assert max(plain) / min(plain) < 1.01 and all(r["wall_s"] < 20 for r in recs)
    assert recs[4]["iterations"][2]["loss"] < 1 < recs[0]["iterations"][2]["loss"]

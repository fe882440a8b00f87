"""records.run_lock.stale_snakemake_lock (issue 54 item 7): after a kill -9 of snakemake its lock files stay
in .snakemake/locks and Snakemake refuses the plain rerun that docs/run-integrity.md says resumes; tptune
tells a lock whose holder is gone from a live one and gives the command that removes it. Real files, real
processes; the end-to-end kill is in tests/workflow/test_run_integrity.py."""
import os
import subprocess
import time

from tptune.records.run_dir import RunDir
from tptune.records.run_lock import stale_snakemake_lock

ARGV = ["/usr/bin/snakemake", "--cores", "2", "--configfile", "my run.yaml"]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _state(tmp_path, holder: int, locks_newer: bool = False, run: str = "r"):
    """Snakemake's lock files (as snakemake.persistence writes them: one path a line) naming ``run``'s
    files, and outputs/r/.run.lock naming ``holder`` (as records.files.take_lock writes it)."""
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text(f"outputs/{run}/report.md\noutputs/{run}/search/done.json\n")
    (locks / "0.output.lock").write_text(f"outputs/{run}/model.json\n")
    lock = tmp_path / "outputs" / "r" / ".run.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{holder}\n")
    stamp = time.time() - 100
    os.utime(lock, (stamp, stamp))
    for f in locks.iterdir():
        os.utime(f, (stamp + (10 if locks_newer else -1),) * 2)
    return RunDir(tmp_path / "outputs" / "r"), locks


def test_a_lock_left_by_a_snakemake_that_is_gone_gives_the_unlock_command(tmp_path):
    run, locks = _state(tmp_path, _dead_pid())
    said = stale_snakemake_lock(run, ARGV, locks)
    assert said and "snakemake --unlock --cores 2 --configfile 'my run.yaml'" in said, said
    assert str(run) in said and "gone" in said


def test_a_live_holder_or_another_runs_lock_is_left_alone(tmp_path):
    run, locks = _state(tmp_path / "live", os.getpid())           # the holder runs
    assert stale_snakemake_lock(run, ARGV, locks) is None
    run, locks = _state(tmp_path / "starting", _dead_pid(), locks_newer=True)
    assert stale_snakemake_lock(run, ARGV, locks) is None          # a snakemake between its lock and onstart
    run, locks = _state(tmp_path / "other", _dead_pid(), run="other-run")
    assert stale_snakemake_lock(run, ARGV, locks) is None          # the lock names another run's files
    run, locks = _state(tmp_path / "unlocking", _dead_pid())
    assert stale_snakemake_lock(run, [*ARGV, "--unlock"], locks) is None
    assert stale_snakemake_lock(RunDir(tmp_path / "none" / "r"), ARGV, tmp_path / "none" / "locks") is None

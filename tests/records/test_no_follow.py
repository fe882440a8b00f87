"""A run's lock and records are never written through a planted link (issue 54 item 1): before, a symlink
at outputs/<run>/.run.lock or progress.jsonl had its target truncated and overwritten by the next run.
Real files, real links, the functions the workflow's onstart and jobs call."""
import os

import pytest

from tptune.errors import TptuneError
from tptune.records import progress
from tptune.records.files import take_lock, write_text_atomic
from tptune.records.run_dir import RunDir
from tptune.records.run_lock import start_run


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


def test_the_run_lock_is_not_taken_through_a_link(tmp_path):
    victim = _victim(tmp_path)
    run = RunDir(tmp_path / "outputs" / "r")
    run.root.mkdir(parents=True)
    run.run_lock.symlink_to(victim)
    with pytest.raises(TptuneError) as e:
        start_run(run, '{"run": "r"}')
    assert str(run.run_lock) in str(e.value) and "symbolic link" in str(e.value), str(e.value)
    assert victim.read_text() == "precious\n"
    assert not run.config_json.exists()          # refused before anything was written


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    """A FIFO planted as a lock: refused at once (no hang opening it, nothing written into it)."""
    fifo = tmp_path / ".measuring.lock"
    os.mkfifo(fifo)
    with pytest.raises(TptuneError, match="not a regular file"):
        take_lock(fifo)


def test_progress_is_not_appended_through_a_link(tmp_path):
    """Recording progress never fails a run: the line is dropped, the link's target untouched."""
    victim = _victim(tmp_path)
    run = RunDir(tmp_path / "outputs" / "r")
    run.root.mkdir(parents=True)
    run.progress_jsonl.symlink_to(victim)
    assert progress.record_start(run, now=1.0) is False
    assert victim.read_text() == "precious\n"
    os.unlink(run.progress_jsonl)
    assert progress.record_start(run, now=1.0) is True and progress.read_events(run.progress_jsonl)


def test_an_atomic_write_never_follows_a_planted_temporary_file(tmp_path):
    """The temporary file beside the record is created anew (never opened through a link planted at its
    predictable name); the record replaces the link, the target stays."""
    victim = _victim(tmp_path)
    record = tmp_path / "config.json"
    tmp = tmp_path / f"config.json.{os.getpid()}.tmp"
    tmp.symlink_to(victim)
    write_text_atomic(record, "{}")
    assert record.read_text() == "{}" and victim.read_text() == "precious\n"
    assert not tmp.exists() and not tmp.is_symlink()

"""Every file a rule writes appears whole or not at all (issue 47 item 1): on a full disk `tptune collect`
leaves no 0-byte measurements.parquet that Snakemake would take as done, and says why on the console."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import polars as pl
import pytest

from conftest import ROOT
from tptune.records import files

RUN = ROOT / "results" / "knobs-mixtral-8x7b-h200x2"     # the smallest committed run with sessions and analysis


def _mount_tmpfs(where, size):
    where.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode()[:200]}")


def _fill(disk):
    """Fill the filesystem: the filler grows until the kernel says ENOSPC."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_collect_on_a_full_disk_leaves_no_file_and_tells_the_console(tmp_path):
    """Before: a polars traceback in a log nobody could read (it is on the full disk), and a 0-byte
    measurements.parquet that made the rerun fail in `report`. Now: no file and no temporary file, one line on
    the console (fd 3, as the Snakefile's shell prefix opens it) naming the file and the full disk; after
    space is freed the same command writes the whole table."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "8m")
    try:
        run = disk / "run"
        run.mkdir()
        shutil.copy(RUN / "config.json", run)
        for sub in ("sessions", "analysis"):
            shutil.copytree(RUN / sub, run / sub)
        # as the workflow's collect takes them: the searches' and TP points' sessions
        sessions = sorted(str(p) for p in (run / "sessions").rglob("session.json") if "layer" not in p.parts)
        out = run / "measurements.parquet"
        (run / "logs").mkdir()
        _fill(disk)
        rule = ("set -euo pipefail; exec 3>&2; "      # the Snakefile's shell.prefix, then the collect rule
                f"{sys.executable} -m tptune collect --sessions {' '.join(sessions)} --out {out} "
                f"> {run}/logs/collect.log 2>&1")
        p = subprocess.run(["bash", "-c", rule], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert f"tptune collect: {out}: No space left on device (the disk is full: free space and run again" \
            in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
        assert not out.exists() and not out.with_suffix(".csv").exists()
        assert not list(run.glob("*.tmp"))
        (disk / "filler").unlink()
        p = subprocess.run(["bash", "-c", rule], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (run / "logs/collect.log").read_text()
        table = pl.read_parquet(out)
        assert table.height == pl.read_csv(out.with_suffix(".csv")).height > 0
        assert table.height == pl.read_parquet(RUN / "measurements.parquet").height
    finally:
        subprocess.run(["umount", str(disk)])


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, monkeypatch):
    """The disk filling at the sync (where a delayed-allocation filesystem reports it) is injected at the OS
    boundary; the write-then-rename is the real code: the earlier file stays whole, nothing else is left, and
    the error names the file."""
    path = tmp_path / "decisions.json"
    files.write_text_atomic(path, '{"old": 1}')

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as e:
        files.write_text_atomic(path, '{"new": 2}')
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert path.read_text() == '{"old": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["decisions.json"]
    with pytest.raises(OSError):
        files.write_via_buffer(tmp_path / "table.parquet", pl.DataFrame({"a": [1]}).write_parquet)
    assert [p.name for p in tmp_path.iterdir()] == ["decisions.json"]

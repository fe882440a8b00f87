"""The run's lock and its resolved config: written once snakemake holds the run (its onstart), never at
parse time or in a dry run (docs/run-integrity.md)."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from tptune.errors import TptuneError
from tptune.records.files import take_lock, write_text_atomic
from tptune.records.run_dir import RunDir

_RUN_LOCK = None   # the open lock file of the run this process (snakemake) drives; closed at exit


def start_run(run: RunDir, text: str) -> None:
    """Snakemake's onstart (after its lock, never in a dry run): hold the run's lock for the life of this
    process, then write the resolved config where it changed. Another invocation running this run
    holds the lock: refused, with nothing written (its jobs read this config.json)."""
    global _RUN_LOCK
    config_json = run.config_json
    try:
        run.root.mkdir(parents=True, exist_ok=True)
        fh, holder = take_lock(run.run_lock)
    except OSError as exc:
        raise TptuneError(f"{exc.filename or run}: cannot write the run's folder ({exc.strerror}): nothing "
                          "measured; give a writable outputs/ (or free space) and run again") from None
    if fh is None:
        raise TptuneError(f"{run} is being run by another snakemake (pid {holder}): nothing written; wait for "
                          "it to end (or stop it) and run again")
    _RUN_LOCK = fh
    try:
        same = config_json.read_text() == text
    except OSError:
        same = False
    if not same:
        try:
            write_text_atomic(config_json, text)
        except OSError as exc:
            raise TptuneError(f"{exc.filename or config_json}: cannot write the run's config ({exc.strerror}): "
                              "nothing measured; free space (or make it writable) and run again") from None


SNAKEMAKE_LOCKS = Path(".snakemake") / "locks"   # where snakemake (snakemake.persistence) keeps its lock files


def _gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (a zombie counts as gone: it was killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def stale_snakemake_lock(run: RunDir, argv: list[str], locks: Path = SNAKEMAKE_LOCKS) -> str | None:
    """What to do where Snakemake's lock on ``run`` was left by a snakemake that is gone, else None.

    A snakemake killed outright (kill -9, a power loss) leaves its lock files in ``locks`` and Snakemake then
    refuses every rerun of the run. Its holder is gone when the run's own lock (``.run.lock``, which
    start_run takes in Snakemake's onstart, after Snakemake's lock) names a pid that no longer runs, and
    every lock file naming the run's files is no newer than it: a live snakemake between its lock and its
    onstart wrote its lock files after the last ``.run.lock``, and one past its onstart still runs. ``argv``
    is this snakemake's command line: the command given is it with ``--unlock`` (None while unlocking, or in a
    job's own snakemake, ``--mode``)."""
    if any(a == "--unlock" or a.startswith("--mode") for a in argv[1:]):
        return None
    workdir, root = locks.parent.parent, run.root.resolve()
    mine = []
    try:
        files = [f for f in locks.glob("*.lock") if f.is_file()]
        for f in files:
            named = [Path(x.strip()) for x in f.read_text().splitlines() if x.strip()]
            if any((p if p.is_absolute() else workdir / p).resolve().is_relative_to(root) for p in named):
                mine.append(f.stat().st_mtime)
        holder = int(run.run_lock.read_text().split()[0])
        taken = run.run_lock.stat().st_mtime
    except (OSError, ValueError, IndexError):
        return None
    if not mine or max(mine) > taken or not _gone(holder):
        return None
    return (f"Snakemake's lock on {run} was left by a snakemake that is gone (pid {holder}, killed before it "
            "could remove it), so Snakemake refuses this run; remove the lock, then run the same command again "
            f"(the run resumes where it stopped): snakemake --unlock {shlex.join(argv[1:])}")

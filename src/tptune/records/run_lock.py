"""The run's lock and its resolved config: written once snakemake holds the run (its onstart), never at
parse time or in a dry run (docs/run-integrity.md)."""
from __future__ import annotations

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

"""One line to the person running the workflow: the console fd the workflow's jobs hold
(TPTUNE_CONSOLE_FD, the Snakefile's shell prefix: Snakemake's own stderr, where a job's stdout and stderr
go to its log; under Slurm, the job's log), else stderr. Never raises: a line is never worth a session."""
from __future__ import annotations

import os
import sys

CONSOLE_ENV = "TPTUNE_CONSOLE_FD"
SHELL_PREFIX_FD = 3     # the fd the Snakefile's shell prefix opens on Snakemake's stderr


def say(text: str, log_first: bool = False) -> None:
    """``text`` as one line on the console (module doc); ``log_first``: on stderr (the job's log) first, the
    console only where that fails (a full disk), for errors a log should keep."""
    if log_first:
        _written(_to_stderr, text) or _written(_to_console, text, SHELL_PREFIX_FD)
    else:
        _written(_to_console, text, None) or _written(_to_stderr, text)


def _written(out, *args) -> bool:
    try:
        return out(*args)
    except OSError:
        return False


def _to_console(text: str, default_fd: int | None) -> bool:
    try:
        fd = int(os.environ.get(CONSOLE_ENV, ""))
    except ValueError:
        fd = default_fd
    if fd is None:
        return False
    os.write(fd, (text + "\n").encode())
    return True


def _to_stderr(text: str) -> bool:
    print(text, file=sys.stderr, flush=True)
    return True

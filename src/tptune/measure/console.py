"""One line to the person running the workflow: the console fd the workflow's jobs hold
(TPTUNE_CONSOLE_FD, the Snakefile's shell prefix: Snakemake's own stderr, where a job's stdout and stderr
go to its log; under Slurm, the job's log), else stderr. Never raises: a line is never worth a session."""
from __future__ import annotations

import os
import sys

CONSOLE_ENV = "TPTUNE_CONSOLE_FD"


def say(text: str) -> None:
    """``text`` as one line on the console (module doc)."""
    try:
        fd = int(os.environ.get(CONSOLE_ENV, ""))
    except ValueError:
        fd = None
    try:
        if fd is not None:
            os.write(fd, (text + "\n").encode())
            return
    except OSError:
        pass
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass

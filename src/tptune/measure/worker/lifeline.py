"""A worker group dies with whoever it works for (issue 34, docs/run-integrity.md "Interrupted runs").

- Each rank asks Linux for SIGKILL when its parent (torch.distributed.run's agent, which starts every
  rank in a session of its own) dies, so no rank outlives its group.
- While rank 0 computes a case, a watcher thread reads the client's connection: a client that goes away
  before its answer (Ctrl-C, SIGTERM, SIGKILL of the measuring job) takes the whole group with it (SIGKILL
  to the agent, whose death kills every rank), so no group goes on computing an abandoned case.
- While rank 0 computes a case it holds ``<socket>.busy`` (an flock): a client that holds the group's
  GPUs and finds it busy knows the group computes a case nobody waits for, and ends it.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path

from tptune.errors import TptuneError
from tptune.records.files import open_lock

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) for this process (Linux); False where it is not available. A parent
    that died before the call would never signal: then this process ends now."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os._exit(1)
    return ok


def busy_path(sock: str | Path) -> Path:
    return Path(str(sock) + ".busy")


class Busy:
    """rank 0's busy lock: held from a request's arrival to its answer."""

    def __init__(self, sock: str | Path):
        self.fh = open_lock(busy_path(sock))     # never through a planted link

    def __enter__(self):
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)


def is_busy(sock: str | Path) -> bool:
    """Whether a group's rank 0 is computing a case now (its busy lock is held)."""
    try:
        fh = open_lock(busy_path(sock))
    except (OSError, TptuneError):      # none, or a link planted there (never opened through)
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def watch_client(conn: socket.socket) -> threading.Event:
    """Kill this process group when ``conn``'s peer closes before ``done`` (the returned event) is set."""
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                readable, _, _ = select.select([conn], [], [], 0.2)
                if readable and not done.is_set() and conn.recv(1, socket.MSG_PEEK) == b"":
                    break
            except (OSError, ValueError):
                break
        if not done.is_set():
            os.kill(os.getppid(), signal.SIGKILL)   # the agent; every rank dies with it (die_with_parent)
            os._exit(1)

    threading.Thread(target=watch, daemon=True, name="client-watch").start()
    return done

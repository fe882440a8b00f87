"""How a run's files are written and held: atomically (a reader sees the old file or the new one,
never half of one), and under a lock file that names the process holding it."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        # a full disk fails the write, not the open: name the file (the old one stays as it was)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def take_lock(path: Path) -> tuple[IO | None, str]:
    """Take the exclusive lock on ``path`` without waiting: (the open file, now naming this process's
    pid, "") while held; or (None, the holder's pid as it wrote it, "?" if none) when another holds it.
    Closing the file (or the process ending) releases the lock."""
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        return None, holder
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh, ""

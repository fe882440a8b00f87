"""How a run's files are written and held: atomically (a reader sees the old file or the new one,
never half of one, and a failed write leaves no file behind), and under a lock file that names the
process holding it."""
from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path
from typing import IO, Callable


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """``data`` to ``path``, whole or not at all: written to a temporary file in the same folder, synced,
    then renamed over ``path``. On failure (a full disk fails the write or the sync, not the open) the
    temporary file is removed, an earlier ``path`` stays as it was, and the OSError names ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_via_buffer(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """What ``write`` puts in a binary file object (a polars table, a matplotlib figure), to ``path``
    atomically. Serialised in memory first: a library writing the file itself reports a full disk in its
    own error type, without the errno (polars: ComputeError), and leaves a part-written file."""
    buf = io.BytesIO()
    write(buf)
    write_bytes_atomic(path, buf.getvalue())


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

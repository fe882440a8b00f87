"""How a run's files are written and held: atomically (a reader sees the old file or the new one,
never half of one, and a failed write leaves no file behind), and under a lock file that names the
process holding it.

No lock or record is opened through a link (issue 54): a symbolic link planted where a lock file or an
appended record goes (the worker pool lies in world-writable /tmp) would have its target truncated and
written. They are opened with O_NOFOLLOW and refused unless a regular file, naming the file; a temporary file
is created anew, never opened where it stands. The pool's folders are made private (``private_folder``).
"""
from __future__ import annotations

import errno
import fcntl
import io
import os
import stat
from pathlib import Path
from typing import IO, Callable

from tptune.errors import TptuneError


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """``data`` to ``path``, whole or not at all: written to a temporary file in the same folder, synced,
    then renamed over ``path``. On failure (a full disk fails the write or the sync, not the open) the
    temporary file is removed, an earlier ``path`` stays as it was, and the OSError names ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)      # a leftover (or a link planted at the name): created anew below
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644),
                       "wb") as f:
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


def open_no_follow(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """A descriptor of ``path`` (os.open ``flags``), never through a symbolic link at its name and only of a
    regular file (a FIFO would block, a device would be written): else TptuneError naming the file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TptuneError(f"{path}: is a symbolic link, not a file of tptune's: refused (it would write "
                              "through it to the file it names); remove it if you did not make it, and run "
                              "again") from None
        if exc.errno != errno.ENXIO:      # a FIFO nobody reads (O_NONBLOCK, write-only): judged below
            raise
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TptuneError(f"{path}: not a regular file: refused as a lock or record file; remove it if you did not "
                          "make it, and run again")
    os.set_blocking(fd, True)
    return fd


def open_lock(path: str | Path) -> IO:
    """The lock file ``path`` opened for reading and writing (made where missing), through no link."""
    return os.fdopen(open_no_follow(path, os.O_RDWR | os.O_CREAT), "r+")


def take_lock(path: Path) -> tuple[IO | None, str]:
    """Take the exclusive lock on ``path`` without waiting: (the open file, now naming this process's
    pid, "") while held; or (None, the holder's pid as it wrote it, "?" if none) when another holds it.
    Closing the file (or the process ending) releases the lock. A link or a non-regular file at ``path``:
    TptuneError (open_no_follow)."""
    fh = open_lock(path)
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


def private_folder(path: str | Path, setting: str) -> Path:
    """``path`` as a folder only this user may write: made 0700 where missing; an existing one must be a
    folder (not a link to one) that this user owns and group and others cannot write, and is then made
    0700. Else TptuneError naming the folder and ``setting`` (the config field that put it there). A folder
    another user owns or may write could hold links planted where this user's lock files go."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TptuneError(f"field '{setting}': cannot make the folder {path} ({exc.strerror}): give a folder "
                          "you may write") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise TptuneError(f"field '{setting}': {path} is a symbolic link, not a folder: refused (someone may "
                          "have planted it); remove it if you did not make it, and run again")
    if not stat.S_ISDIR(st.st_mode):
        raise TptuneError(f"field '{setting}': {path} is not a folder: remove it, or give another {setting}")
    if st.st_uid != os.getuid():
        raise TptuneError(f"field '{setting}': {path} belongs to {owner_name(st.st_uid)}, not to you: its owner "
                          f"could plant links where your lock files go; give a {setting} of your own")
    if st.st_mode & 0o022:
        raise TptuneError(f"field '{setting}': {path} may be written by group or others (mode "
                          f"{oct(stat.S_IMODE(st.st_mode))}): anyone could plant links where your lock files go; "
                          f"check what is in it, then chmod 700 {path}, or give another {setting}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def owner_name(uid: int) -> str:
    """"user alice (uid 1001)", or "uid 1001" where the name is unknown."""
    try:
        import pwd
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"

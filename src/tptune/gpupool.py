"""GPU ids for concurrent jobs: one lock file per GPU, held (flock) for the life of the job.

Snakemake's `resources: gpus=<tp>` keeps the number of GPUs in use within the node, but it does not
say *which* GPUs a job gets. Each job takes `tp` free ids here; the locks are fcntl locks on open
files, so a job that is killed frees its GPUs with its process.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path


def count_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else the driver's list (no torch import)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip()])
    drv = Path("/proc/driver/nvidia/gpus")
    return len(list(drv.iterdir())) if drv.is_dir() else 0


def visible_ids(n: int) -> list[str]:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [v.strip() for v in vis.split(",") if v.strip()][:n]
    return [str(i) for i in range(n)]


class GpuPool:
    def __init__(self, lock_dir: str | Path, ids: list[str]):
        self.lock_dir = Path(lock_dir)
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self.ids = list(ids)

    def _try_lock(self, gid: str):
        fh = open(self.lock_dir / f"gpu{gid}.lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        return fh

    def try_acquire(self, n: int, prefer: list[list[str]] = ()) -> tuple[list[str], list] | None:
        """Lock ``n`` GPUs now or return None. Sets in ``prefer`` (warm worker groups) are tried first,
        then aligned blocks (0-1, 2-3 ... for n=2), so TP groups stay on neighbouring GPUs."""
        if n > len(self.ids):
            raise ValueError(f"a case needs {n} GPUs but the pool has {len(self.ids)} ({self.ids})")
        aligned = [self.ids[i:i + n] for i in range(0, len(self.ids) - n + 1, n)]
        for cand in list(prefer) + aligned + [None]:
            held, got = [], []
            pool = cand if cand is not None else self.ids
            for gid in pool:
                fh = self._try_lock(gid)
                if fh:
                    held.append(fh)
                    got.append(gid)
                    if len(got) == n:
                        return got, held
            for fh in held:
                fh.close()
        return None

    @contextmanager
    def acquire(self, n: int, prefer: list[list[str]] = (), timeout: float = 24 * 3600, poll: float = 0.2):
        deadline = time.monotonic() + timeout
        while True:
            got = self.try_acquire(n, prefer)
            if got:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {n} free GPUs in {self.lock_dir} after {timeout:.0f}s")
            time.sleep(poll)
        ids, handles = got
        try:
            yield ids
        finally:
            for fh in handles:
                fh.close()

"""GPU ids for concurrent jobs: one lock file per GPU, held (flock) for the life of the job.

Snakemake's `resources: gpus=<tp>` keeps the number of GPUs in use within the node, but it does not
say *which* GPUs a job gets. Each job takes `tp` free ids here; the locks are fcntl locks on open
files, so a job that is killed frees its GPUs with its process.

Which ids exist at all depends on where the process runs:
- inside a Slurm allocation (``SLURM_JOB_ID`` set), the GPUs Slurm granted this job or step:
  ``CUDA_VISIBLE_DEVICES`` as Slurm sets it, else ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``; an
  allocation without GPUs has none, whatever the submitting shell exported;
- elsewhere, ``CUDA_VISIBLE_DEVICES`` if set, else every GPU the driver lists.
Without an NVIDIA driver there are no GPUs, whatever the variables say.

The pool's folder (``pool_folder``: ``<launcher.pool_dir>/<user>/<scope>``, default under world-writable /tmp)
holds the lock files and the warm worker groups' registry and sockets: it is made private to the user and a
folder another user could write is refused; a lock file is never opened through a link (issue 54).
"""
from __future__ import annotations

import fcntl
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping

from tptune.errors import TptuneError
from tptune.measure.console import say
from tptune.records.files import open_lock, owner_name, private_folder

_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_PROBE = object()


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _expand_slurm_ids(value: str) -> list[str]:
    """SLURM_*_GPUS are comma lists of indices; ranges ("0-3") are expanded for safety."""
    out: list[str] = []
    for part in _split(value):
        lo, sep, hi = part.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            out.extend(str(i) for i in range(int(lo), int(hi) + 1))
        else:
            out.append(part)
    return out


def driver_gpu_count() -> int | None:
    """GPUs the NVIDIA driver lists, or None when there is no driver on this machine."""
    if _DRIVER_GPUS.is_dir():
        return len(list(_DRIVER_GPUS.iterdir()))
    if Path("/dev/nvidiactl").exists():
        return len([p for p in Path("/dev").glob("nvidia[0-9]*")])
    return None


def slurm_allocation(env: Mapping[str, str] | None = None) -> dict | None:
    """The Slurm job (and step) this process runs in, or None outside Slurm."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    return {"job_id": job, "step_id": env.get("SLURM_STEP_ID"), "node": env.get("SLURMD_NODENAME"),
            "cluster": env.get("SLURM_CLUSTER_NAME"), "partition": env.get("SLURM_JOB_PARTITION"),
            "gpus": scheduler_gpu_ids(env)}


def scheduler_gpu_ids(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPU ids Slurm granted this process's job or step, or None outside a Slurm allocation.

    ``CUDA_VISIBLE_DEVICES`` comes first: it is what Slurm sets for the job's processes (renumbered
    from 0 where Slurm constrains devices with cgroups, the physical indices otherwise) and the only
    one left when a launcher strips the other SLURM_* variables (the Snakemake jobstep does). A
    ``CUDA_VISIBLE_DEVICES`` with more entries than the allocation's GPU list keeps only the
    allocation's (or its first ones, when the two are numbered differently).
    """
    env = os.environ if env is None else env
    if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
        return None
    granted = None
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(key) is not None:
            granted = _expand_slurm_ids(env[key])
            break
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() not in ("", "NoDevFiles"):
        ids = _split(cvd)
        if granted is not None and len(ids) > len(granted):
            inside = [i for i in ids if i in granted]
            ids = inside if len(inside) == len(granted) else ids[:len(granted)]
        return ids
    return granted if granted is not None else []


def available_ids(env: Mapping[str, str] | None = None, driver_count=_PROBE) -> list[str]:
    """Every GPU id this process may hand out (see the module docstring for the order).
    ``driver_count``: GPUs the driver lists, None for no driver (tests); probed by default."""
    env = os.environ if env is None else env
    n_driver = driver_gpu_count() if driver_count is _PROBE else driver_count
    if n_driver is None:
        return []
    granted = scheduler_gpu_ids(env)
    if granted is not None:
        return granted
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return _split(vis)
    return [str(i) for i in range(n_driver)]


def count_gpus() -> int:
    """GPUs this process may use (no torch import): the scheduler's grant inside Slurm, else
    CUDA_VISIBLE_DEVICES if set, else the driver's list."""
    return len(available_ids())


def cpu_slot_ids(cpu_slots: int) -> list[str]:
    """The CPU worker pool's ids: the cores this process may run on, at most ``cpu_slots`` (launcher.cpu_slots)
    of them. What the launcher measures on and the plan lays sessions on."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return [str(c) for c in list(cores)[:max(1, int(cpu_slots))]]


def visible_ids(n: int) -> list[str]:
    """The first ``n`` GPU ids this process may use; never an id outside a Slurm allocation."""
    return available_ids()[:n]


def pool_scope(env: Mapping[str, str] | None = None) -> str:
    """A name for the GPU id namespace of this process: "local", or "slurm-<job>[.<step>]".

    Where Slurm constrains devices, two jobs on one node both see their GPUs as 0, 1, ...: lock
    files and warm worker groups keyed by id must then live in a folder of their own per allocation
    (``Path(pool_dir) / pool_scope()``), or one job would wait for, or reach, another's GPUs.
    """
    alloc = slurm_allocation(env)
    if alloc is None:
        return "local"
    return f"slurm-{alloc['job_id']}" + (f".{alloc['step_id']}" if alloc["step_id"] not in (None, "") else "")


def pool_folder(pool_dir: str, env: Mapping[str, str] | None = None) -> Path:
    """This user's folder of the machine's pool, ``<pool_dir>/<user>/<scope>`` (pool_scope), made where
    missing: the lock files' folder and the worker groups' registry and sockets. ``pool_dir`` (the setting
    launcher.pool_dir) may be shared, as /tmp is: it must be owned by this user or root, and writable by
    others only with the sticky bit (nobody may then rename another's folder in it). The user's folder and
    the scope's are private (records.files.private_folder). Else TptuneError naming launcher.pool_dir."""
    env = os.environ if env is None else env
    base = Path(pool_dir)
    try:
        base.mkdir(parents=True, mode=0o700, exist_ok=True)
        st = os.stat(base)      # the setting may name a link (a scratch folder): its target is judged
    except OSError as exc:
        raise TptuneError(f"field 'launcher.pool_dir' = {pool_dir!r}: cannot make the folder ({exc.strerror}): "
                          "give a folder you may write (default /tmp/tptune-pool)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TptuneError(f"field 'launcher.pool_dir' = {pool_dir!r}: not a folder")
    if st.st_uid not in (os.getuid(), 0):
        raise TptuneError(f"field 'launcher.pool_dir' = {pool_dir!r}: belongs to {owner_name(st.st_uid)}, who could "
                          "replace your pool folder in it; give a launcher.pool_dir of your own")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise TptuneError(f"field 'launcher.pool_dir' = {pool_dir!r}: group or others may write it (mode "
                          f"{oct(stat.S_IMODE(st.st_mode))}) without the sticky bit (as /tmp has): anyone could "
                          "replace your pool folder in it; chmod +t it, or give a folder of your own")
    user = private_folder(base / (env.get("USER") or str(os.getuid())), "launcher.pool_dir")
    return private_folder(user / pool_scope(env), "launcher.pool_dir")


class GpuPool:
    def __init__(self, lock_dir: str | Path, ids: list[str], allowed: list[str] | None = None):
        """``ids``: the pool. ``allowed``: when given (e.g. ``scheduler_gpu_ids()`` inside Slurm), the
        pool keeps only those ids, so it never hands out one outside the allocation."""
        self.lock_dir = Path(lock_dir)
        self.lock_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        self.ids = [i for i in ids if allowed is None or i in allowed]
        self.last_wait_s = 0.0
        self.last_wait_by: str | None = None   # who held the pool through the last wait: own | other | own+other

    def _try_lock(self, gid: str, owner: str = ""):
        fh = open_lock(self.lock_dir / f"gpu{gid}.lock")     # never through a planted link
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n{owner}\n")   # the holder, and the run it measures for (holders)
        fh.flush()
        return fh

    def try_acquire(self, n: int, prefer: list[list[str]] = (), owner: str = "") -> tuple[list[str], list] | None:
        """Lock ``n`` GPUs now or return None. Sets in ``prefer`` (warm worker groups) are tried first,
        then aligned blocks (0-1, 2-3 ... for n=2), so TP groups stay on neighbouring GPUs. A
        preferred set with an id outside the pool is skipped. ``owner``: the run the holder measures
        for, written beside its pid."""
        if n > len(self.ids):
            raise ValueError(f"a case needs {n} GPUs but the pool has {len(self.ids)} ({self.ids})")
        pool_ids = set(self.ids)
        prefer = [p for p in prefer if set(p) <= pool_ids]
        aligned = [self.ids[i:i + n] for i in range(0, len(self.ids) - n + 1, n)]
        for cand in list(prefer) + aligned + [None]:
            held, got = [], []
            pool = cand if cand is not None else self.ids
            for gid in pool:
                fh = self._try_lock(gid, owner)
                if fh:
                    held.append(fh)
                    got.append(gid)
                    if len(got) == n:
                        return got, held
            for fh in held:
                fh.close()
        return None

    def holders(self) -> list[tuple[int, str]]:
        """(pid, the run it measures for: "" where not named) of each holder the pool's lock files name (each
        holder writes its own; a freed file keeps its last holder's, so these are who holds or last held an
        id)."""
        out = set()
        for gid in self.ids:
            try:
                lines = (self.lock_dir / f"gpu{gid}.lock").read_text().splitlines()
            except OSError:
                continue
            pid = lines[0].strip() if lines else ""
            if pid.isdigit() and int(pid) != os.getpid():
                out.add((int(pid), lines[1].strip() if len(lines) > 1 else ""))
        return sorted(out)

    def _held_by(self, holders: list[tuple[int, str]], owner: str, what: str) -> str:
        """Who holds the pool, in words: the run's own jobs (``owner``'s), others, or both."""
        own = [p for p, o in holders if owner and o == owner]
        other = [p for p, o in holders if not (owner and o == owner)]
        parts = []
        if own:
            parts.append(f"held by pid {', '.join(map(str, own))}: this run's own measuring job(s), more at once "
                         f"than the pool's {len(self.ids)} {what} hold")
        if other or not own:
            parts.append(f"held by pid {', '.join(map(str, other)) or 'unknown'}: another run, a test run or a "
                         "leftover job")
        return "; ".join(parts)

    @contextmanager
    def acquire(self, n: int, prefer: list[list[str]] = (), timeout: float = 24 * 3600, poll: float = 0.2,
                what: str = "GPUs", waiting_for: str = "", owner: str = ""):
        """Lock ``n`` ids for the body, waiting while others hold them. ``owner``: the run this job measures
        for (its folder), written beside its pid, so a wait tells the run's own jobs from others'. A wait
        says one line on the console when it starts (``what``: the ids' name, ``waiting_for``: who waits,
        and who holds them) and leaves its length in ``last_wait_s`` (0.0 without one) and who held the
        pool in ``last_wait_by``, which the session's record keeps."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        told = False
        by: set[str] = set()
        while True:
            got = self.try_acquire(n, prefer, owner)
            if got:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {n} free GPUs in {self.lock_dir} after {timeout:.0f}s")
            holders = self.holders()
            by |= {"own" if owner and o == owner else "other" for _, o in holders}
            if not told:
                say(f"tptune: {waiting_for + ' ' if waiting_for else ''}waits for {n} {what} of the shared pool "
                    f"{self.lock_dir} ({self._held_by(holders, owner, what)}); it starts when they are free")
                told = True
            time.sleep(poll)
        self.last_wait_s = time.monotonic() - t0 if told else 0.0
        self.last_wait_by = ("own+other" if by == {"own", "other"} else next(iter(by), "other")) if told else None
        ids, handles = got
        try:
            yield ids
        finally:
            for fh in handles:
                fh.close()

"""GPU ids from the scheduler: inside a Slurm allocation the pool is what Slurm granted, never more."""
import pytest

from tptune.measure import gpupool
from tptune.measure.gpupool import GpuPool, available_ids, pool_scope, scheduler_gpu_ids, slurm_allocation


def test_outside_slurm_nothing_is_granted():
    assert scheduler_gpu_ids({"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert slurm_allocation({}) is None
    assert pool_scope({}) == "local"


def test_local_ids_follow_cuda_visible_devices_then_the_driver():
    assert available_ids({}, driver_count=4) == ["0", "1", "2", "3"]
    assert available_ids({"CUDA_VISIBLE_DEVICES": "2, 3"}, driver_count=4) == ["2", "3"]
    # no driver: no GPUs, whatever the environment says
    assert available_ids({"CUDA_VISIBLE_DEVICES": "0,1"}, driver_count=None) == []
    assert available_ids({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1"}, driver_count=None) == []


def test_slurm_sets_cuda_visible_devices():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"}
    assert scheduler_gpu_ids(env) == ["4", "5"]
    # the node has 8 GPUs, the job was granted two: the pool is those two
    assert available_ids(env, driver_count=8) == ["4", "5"]


def test_constrained_devices_are_renumbered_from_zero():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert scheduler_gpu_ids(env) == ["0", "1"]


def test_step_gpus_before_job_gpus_when_no_cuda_visible_devices():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "2,3"}
    assert scheduler_gpu_ids(env) == ["2", "3"]
    assert scheduler_gpu_ids({"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0-2,5"}) == ["0", "1", "2", "5"]


def test_allocation_without_gpus_hands_out_none():
    # the login shell's CUDA_VISIBLE_DEVICES is not an allocation
    env = {"SLURM_JOB_ID": "42"}
    assert scheduler_gpu_ids(env) == []
    assert available_ids(env, driver_count=8) == []
    assert scheduler_gpu_ids({"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []


def test_cuda_visible_devices_wider_than_the_allocation_is_cut_to_it():
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert scheduler_gpu_ids(env) == ["1", "3"]
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_GPUS": "5,6", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert scheduler_gpu_ids(env) == ["0", "1"]


def test_allocation_record_and_scope():
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURMD_NODENAME": "gpu17",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    rec = slurm_allocation(env)
    assert rec["job_id"] == "42" and rec["node"] == "gpu17" and rec["gpus"] == ["0", "1"]
    assert pool_scope(env) == "slurm-42.3"
    assert pool_scope({"SLURM_JOB_ID": "42"}) == "slurm-42"


def test_count_and_visible_ids_use_the_allocation(monkeypatch):
    monkeypatch.setattr(gpupool, "driver_gpu_count", lambda: 8)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    assert gpupool.count_gpus() == 2
    assert gpupool.visible_ids(8) == ["6", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpupool.count_gpus() == 0


def test_pool_never_hands_out_an_id_outside_the_allocation(tmp_path):
    pool = GpuPool(tmp_path, ["0", "1", "2", "3"], allowed=["2", "3"])
    assert pool.ids == ["2", "3"]
    with pytest.raises(ValueError):
        pool.try_acquire(4)
    # a warm worker group on GPUs of another allocation is not taken, even when its locks are free
    got, handles = pool.try_acquire(2, prefer=[["0", "1"]])
    assert got == ["2", "3"]
    assert pool.try_acquire(2, prefer=[["2", "3"]]) is None
    for fh in handles:
        fh.close()


def test_preferred_set_outside_the_pool_is_skipped(tmp_path):
    pool = GpuPool(tmp_path, ["4", "5"])
    got, handles = pool.try_acquire(2, prefer=[["0", "1"], ["4", "5"]])
    assert got == ["4", "5"]
    for fh in handles:
        fh.close()

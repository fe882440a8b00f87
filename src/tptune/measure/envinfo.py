"""What a measurement ran on: versions, GPUs, topology. Collected once per worker start."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import socket
import subprocess

from tptune.measure.gpupool import slurm_allocation

SAFE_ENV = {
    # NVLink multicast stays off unless the user opts in: on shared hosts it can take a node down.
    "UB_SKIPMC": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    # TE/Megatron TP overlap on Hopper expects one hardware queue, so kernels keep launch order.
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}
MULTICAST_KEYS = ("UB_SKIPMC", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def launch_env(base: dict, multicast: bool = False, extra: dict | None = None) -> dict:
    """The environment of a launched worker: the safety variables unless multicast is opted into."""
    env = dict(base)
    for k, v in SAFE_ENV.items():
        if multicast and k in MULTICAST_KEYS:
            env.pop(k, None)
        else:
            env[k] = v
    env.update(extra or {})
    return env


def _version(dist_names: tuple[str, ...]) -> str | None:
    for n in dist_names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def collect(device_type: str) -> dict:
    import torch

    info = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_engine": _version(("transformer-engine", "transformer_engine")),
        "megatron_core": _version(("megatron-core", "megatron_core")),
        "cpu_count": os.cpu_count(),
        "device_type": device_type,
        "env": {k: os.environ.get(k) for k in SAFE_ENV},
        "scheduler": slurm_allocation(),  # the Slurm job/step and its GPUs, None outside Slurm
    }
    if device_type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update({
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu_name": props.name,
            "sm_count": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "topology": _run(["nvidia-smi", "topo", "-m"]),
        })
    return info

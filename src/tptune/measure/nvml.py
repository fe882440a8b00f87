"""The NVIDIA driver's management library (libnvidia-ml.so.1), loaded with ctypes: no Python package,
no CUDA context. The workers read clocks through it (worker/gpu_clock); preflight reads the compute
capability through it, because a measuring job that imported torch and opened a CUDA context only to ask
that cost about 2-3 s before every session (a TP 2 knob run starts some 20 of them in a row)."""
from __future__ import annotations

import ctypes

_lib = None


def library():
    """The loaded and initialised library, or None where it is absent (CPU machines, some containers)."""
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
        except (OSError, AttributeError):
            _lib = False
        else:
            _lib = lib
    return _lib or None


def handle(gpu_id: str):
    """NVML's handle of a GPU named as CUDA_VISIBLE_DEVICES names it (an index in the driver's order, or a
    UUID, with or without its GPU-/MIG- prefix), or None."""
    lib = library()
    if lib is None:
        return None
    h = ctypes.c_void_p()
    gpu_id = str(gpu_id).strip()
    if gpu_id.isdigit():
        ok = lib.nvmlDeviceGetHandleByIndex_v2(int(gpu_id), ctypes.byref(h)) == 0
    else:
        names = (gpu_id,) if gpu_id.startswith(("GPU-", "MIG-")) else (gpu_id, "GPU-" + gpu_id)
        ok = any(lib.nvmlDeviceGetHandleByUUID(n.encode(), ctypes.byref(h)) == 0 for n in names)
    return h if ok else None


def compute_capability(gpu_id: str) -> tuple[int, int] | None:
    """The CUDA compute capability of a GPU (see ``handle`` for the id), or None where NVML cannot say."""
    h = handle(gpu_id)
    if h is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    try:
        if library().nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
    except AttributeError:   # a driver older than the call
        return None
    return major.value, minor.value


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def total_memory(gpu_id: str) -> int | None:
    """A GPU's memory in bytes (nvmlDeviceGetMemoryInfo's total; see ``handle`` for the id), or None where
    NVML cannot say."""
    h = handle(gpu_id)
    if h is None:
        return None
    mem = _Memory()
    try:
        if library().nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) != 0:
            return None
    except AttributeError:
        return None
    return int(mem.total) or None

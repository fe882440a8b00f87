"""measure.nvml: the compute capability preflight reads without torch (a CUDA context per measuring job
cost seconds before every session). The driver library is stood in for where this machine has none."""
import ctypes

import pytest

from tptune.measure import nvml, preflight


class _Driver:
    """libnvidia-ml's calls used here, over two GPUs: index 0 and 1, UUIDs GPU-a and GPU-b, sm_90."""
    uuids = {"GPU-a": 0, "GPU-b": 1}

    def __init__(self):
        self.asked = []

    def nvmlDeviceGetHandleByIndex_v2(self, i, ref):
        self.asked.append(("index", i))
        if i not in (0, 1):
            return 2
        ref._obj.value = 100 + i
        return 0

    def nvmlDeviceGetHandleByUUID(self, name, ref):
        self.asked.append(("uuid", name.decode()))
        if name.decode() not in self.uuids:
            return 2
        ref._obj.value = 100 + self.uuids[name.decode()]
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, h, major, minor):
        major._obj.value, minor._obj.value = 9, 0
        return 0


@pytest.fixture
def driver(monkeypatch):
    d = _Driver()
    monkeypatch.setattr(nvml, "_lib", d)
    return d


def test_capability_by_index_and_uuid(driver):
    assert nvml.compute_capability("1") == (9, 0)
    assert nvml.compute_capability("GPU-b") == (9, 0)
    assert nvml.compute_capability("a") == (9, 0)          # a UUID without its prefix, as some tools print it
    assert ("uuid", "GPU-a") in driver.asked


def test_unknown_gpu_gives_none(driver):
    assert nvml.compute_capability("7") is None
    assert nvml.compute_capability("GPU-zz") is None


def test_no_driver_gives_none(monkeypatch):
    monkeypatch.setattr(nvml, "_lib", False)
    assert nvml.library() is None
    assert nvml.compute_capability("0") is None


def test_this_machine_without_a_driver_loads_nothing():
    """The real loader here: no libnvidia-ml on the CI machines, so None and no exception."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        assert nvml.library() is None
    else:
        pytest.skip("this machine has the NVIDIA driver")


def test_preflight_asks_nvml_before_torch(driver, monkeypatch):
    monkeypatch.setattr(preflight, "available_ids", lambda: ["1", "0"])
    monkeypatch.setattr(preflight, "device_capability", lambda: pytest.fail("torch was asked"))
    host = preflight.probe_host(check_hardware=True)
    assert host.capability == (9, 0) and host.gpu_ids == ("1", "0")
    assert driver.asked[0] == ("index", 1)

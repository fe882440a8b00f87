"""FP8 workload: dtype aliases, recipe/format/emulation fields, the recipe-vs-GPU rule, the startup
check on the torch backend, FP8 bytes and peak for the plan."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tptune.errors import ConfigError
from tptune.model.spec import gpu_capability, load_model, parse_model, recipe_device_problem
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_config_files
from tptune.measure.worker.context import TORCH_DTYPES

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "models" / "tiny.yaml"


@pytest.mark.parametrize("alias,fmt", [("fp8", "hybrid"), ("FP8", "hybrid"), ("e4m3", "e4m3"),
                                       ("fp8_e4m3", "e4m3"), ("hybrid", "hybrid"), ("fp8_hybrid", "hybrid")])
def test_dtype_aliases(alias, fmt):
    w = load_model(TINY, {"dtype": alias}).workload
    assert w.dtype == "fp8" and w.recipe == "delayed" and w.fp8_format == fmt and w.fp8_emulation is None
    assert w.params_dtype == "bf16" and w.dtype_bytes == 2 and TORCH_DTYPES[w.dtype] is torch.bfloat16


@pytest.mark.parametrize("given,recipe", [("delayed", "delayed"), ("current", "current"), ("tensorwise", "current"),
                                          ("block", "block"), ("blockwise", "block"), ("mxfp8", "mxfp8"),
                                          ("nvfp4", "nvfp4")])
def test_recipe_names(given, recipe):
    assert load_model(TINY, {"dtype": "fp8", "recipe": given}).workload.recipe == recipe


def test_block_and_mxfp8_default_to_e4m3_like_te():
    assert load_model(TINY, {"dtype": "fp8", "recipe": "mxfp8"}).workload.fp8_format == "e4m3"
    assert load_model(TINY, {"dtype": "fp8", "recipe": "block"}).workload.fp8_format == "e4m3"
    assert load_model(TINY, {"dtype": "hybrid", "recipe": "block"}).workload.fp8_format == "hybrid"


@pytest.mark.parametrize("wl,match", [
    ({"dtype": "fp8", "recipe": "tensor"}, "workload.recipe"),
    ({"dtype": "bf16", "recipe": "delayed"}, "apply to dtype fp8 only"),
    ({"dtype": "e4m3", "fp8_format": "hybrid"}, "contradicts"),
    ({"dtype": "fp8", "fp8_emulation": "fp16"}, "fp8_emulation"),
    ({"dtype": "int8"}, "fp8"),
])
def test_bad_fp8_fields(wl, match):
    with pytest.raises(ConfigError, match=match):
        load_model(TINY, wl)


def test_to_dict_round_trips_and_leaves_other_dtypes_unchanged():
    mc = load_model(TINY, {"dtype": "e4m3", "recipe": "current"})
    d = mc.to_dict()
    assert d["workload"] == {"seq_length": 512, "micro_batch_size": 1, "dtype": "fp8", "recipe": "current",
                             "fp8_format": "e4m3"}
    assert parse_model(d["model"], workload=d["workload"]).workload == mc.workload
    assert set(load_model(TINY, {"dtype": "bf16"}).to_dict()["workload"]) == {"seq_length", "micro_batch_size",
                                                                               "dtype"}


def test_comm_bytes_and_peak():
    w = load_model(TINY, {"dtype": "fp8"}).workload
    assert w.comm_bytes("all_gather") == 1 and w.comm_bytes("reduce_scatter") == 2 and w.comm_bytes(None) == 2
    assert w.peak_tflops({}) == 1979.0 and w.peak_tflops({"peak_tflops_fp8": 1500}) == 1500.0
    bf = load_model(TINY, {"dtype": "bf16"}).workload
    assert bf.comm_bytes("all_gather") == 2 and bf.peak_tflops({}) == 989.0
    emu = load_model(TINY, {"dtype": "fp8", "fp8_emulation": "bf16"}).workload
    assert emu.comm_bytes("all_gather") == 2 and emu.peak_tflops({}) == 989.0
    assert "run as bf16" in emu.precision_label and "delayed scaling" in w.precision_label


@pytest.mark.parametrize("name,cc", [("NVIDIA H100 80GB HBM3", (9, 0)), ("H200", (9, 0)), ("NVIDIA GH200 480GB", (9, 0)),
                                     ("NVIDIA B200", (10, 0)), ("GB200", (10, 0)), ("NVIDIA L40S", (8, 9)),
                                     ("A100-SXM4-80GB", (8, 0)), ("sm_90", (9, 0)), ("mystery", None), (None, None)])
def test_gpu_names(name, cc):
    assert gpu_capability(name) == cc


def test_recipe_device_rule():
    msg = recipe_device_problem("mxfp8", gpu="NVIDIA H100 80GB HBM3")
    assert "mxfp8" in msg and "H100" in msg and "Blackwell" in msg and "9.0" in msg
    assert "nvfp4" in recipe_device_problem("nvfp4", capability=(9, 0))
    assert recipe_device_problem("mxfp8", capability=(10, 0)) is None
    assert "12.0" in recipe_device_problem("mxfp8", capability=(12, 0))
    assert recipe_device_problem("block", gpu="H200") is None
    assert "block" in recipe_device_problem("block", capability=(8, 9))
    assert "delayed" in recipe_device_problem("delayed", gpu="A100")
    assert recipe_device_problem("mxfp8", gpu="some new gpu") is None      # unknown: TE checks on the GPU
    # the capability wins over the name
    assert recipe_device_problem("mxfp8", capability=(10, 0), gpu="H100") is None


def _config(**over):
    cfg = load_config_files(ROOT / "config" / "config.yaml")
    cfg.update({"model": str(TINY), "tp_sizes": [2], "backend": "torch"})
    for k, v in over.items():
        cfg[k] = v
    return cfg


def test_torch_backend_refuses_fp8_in_one_line():
    with pytest.raises(ConfigError) as exc:
        resolve_here(_config(workload={"dtype": "fp8"}), base_dir=ROOT)
    fp8_lines = [p for p in exc.value.problems if "fp8" in p]
    assert len(fp8_lines) == 1 and "needs the te backend" in fp8_lines[0] and "fp8_emulation: bf16" in fp8_lines[0]


def test_torch_backend_runs_fp8_as_bf16_when_asked():
    s = resolve_here(_config(workload={"dtype": "fp8", "fp8_emulation": "bf16"}), base_dir=ROOT)
    assert s.backend == "torch" and s.model.workload.is_fp8 and s.model.workload.fp8_emulation == "bf16"


def test_mxfp8_on_hopper_is_refused_before_any_job():
    cfg = _config(workload={"dtype": "fp8", "recipe": "mxfp8"}, backend="te",
                  hardware={"gpu": "NVIDIA H200"})
    with pytest.raises(ConfigError, match=r"mxfp8.*H200.*cannot run it"):
        resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    cfg["hardware"] = {"gpu": "B200"}
    assert resolve_here(cfg, base_dir=ROOT, check_hardware=False).model.workload.recipe == "mxfp8"

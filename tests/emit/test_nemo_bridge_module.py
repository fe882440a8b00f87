"""The Megatron-Bridge / NeMo 2 module (tp_overlap_cfg_nemo.py): it imports, and its config round-trips
to the chosen ub_cfgs, with the stand-in classes (neither library installed), with classes laid out as
Bridge's and NeMo 2's (fields they lack, Bridge's tuple default of fp8_buf), and from a rederived run."""
import importlib.util
import json
import pickle
import shutil
import sys
import types
from dataclasses import dataclass, make_dataclass
from pathlib import Path

import pytest
import yaml

from tptune.cases import BOOL_KNOBS
from tptune.model.ops import TE_GEMMS
from tptune.emit import configs as emit
from tptune.te.megatron_flags import block_switches, transformer_config_overrides
from tptune.te.ubcfg import METHOD_DEFAULTS, load_preset, validate_ub_cfgs

ROOT = Path(__file__).resolve().parents[2]
KNOBS = ROOT / "results" / "knobs-llama3-70b-x2"
FP8_CURRENT = ROOT / "results" / "fp8-current-llama3-70b-x2"
GEMMS = ["qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad", "qkv_fprop",
         "proj_dgrad", "fc1_fprop", "fc2_dgrad", "proj_fprop", "fc2_fprop"]


def _ints(cfgs):
    return {k: {kk: int(vv) if isinstance(vv, bool) else vv for kk, vv in v.items()} for k, v in cfgs.items()}


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod            # as `import` does (pickle finds the added classes there)
    spec.loader.exec_module(mod)
    return mod


def _effective(cfgs):
    """What TE runs: each GEMM's method defaults under the chosen knobs (fp8_buf off on a pipeline
    GEMM unless chosen): the module writes every knob out."""
    out = {}
    for k, v in _ints(cfgs).items():
        out[k] = {"method": v["method"], **METHOD_DEFAULTS[v["method"]], **v}
        if v["method"] == "pipeline":
            out[k].setdefault("fp8_buf", 0)
    return out


def _back(ub, keep=None):
    """The module's ub_cfgs() in tptune's form (0/1 knobs), keeping only the knobs in ``keep``."""
    return {k: {kk: int(vv) if kk in BOOL_KNOBS else vv for kk, vv in v.items()
                if keep is None or kk in keep.get(k, v)} for k, v in ub.items()}


PIPELINE = {**load_preset("nvidia_bf16_tp2"),
            "proj_fprop": {"method": "pipeline", "num_sm": 24, "cga_size": 2, "set_sm_margin": 1, "num_splits": 4,
                           "comm_priority": -3}}
RS_DGRAD = {k: v for k, v in _ints(yaml.safe_load((KNOBS / "tp_comm_overlap_cfg.yaml").read_text())).items()}
FP8 = _ints(yaml.safe_load((FP8_CURRENT / "tp_comm_overlap_cfg.yaml").read_text()))


@pytest.mark.parametrize("cfgs,fp8", [(PIPELINE, False), (RS_DGRAD, False), (FP8, True)],
                         ids=["pipeline-priority", "rs-dgrad", "fp8"])
def test_module_round_trips_the_chosen_config(cfgs, fp8, tmp_path):
    sw = block_switches(cfgs)
    path = emit.write_bridge_overlap_py(tmp_path / emit.BRIDGE_FILE, cfgs, sw, model="m", fp8=fp8,
                                        workload={"dtype": "fp8" if fp8 else "bf16"})
    compile(path.read_text(), str(path), "exec")
    mod = _load(path, f"tuned_{tmp_path.name}")
    back = _back(mod.ub_cfgs())
    validate_ub_cfgs(back, workload="fp8" if fp8 else "bf16")
    assert back == _effective(cfgs)
    assert mod.model_overrides == transformer_config_overrides(sw)
    absent = [g for g in TE_GEMMS if g not in cfgs]
    assert all(getattr(mod.tp_overlap_cfg, g) is None for g in absent)
    assert path.read_text().startswith("# Written by tptune") and "CommOverlapConfig(tp_comm_overlap=True" in path.read_text()


def _library(name, *, bridge):
    """Classes laid out as Megatron-Bridge's comm_overlap.py (bridge=True) or NeMo 2's userbuffers.py."""
    @dataclass
    class TPOverlapCfg:
        pass

    ring = [("aggregate", bool, False), ("method", str, "ring_exchange"), ("num_sm", int, 1)]
    ring += [("cga_size", int, 1), ("set_sm_margin", bool, False), ("fp8_buf", bool, False),
             ("atomic_gemm", bool, False)] if bridge else [("set_sm_margin", bool, False)]
    from dataclasses import field
    mk = lambda n, fs: make_dataclass(n, [(a, t, field(default=d)) if d is not ... else (a, t) for a, t, d in fs],
                                      bases=(TPOverlapCfg,))
    mod = types.ModuleType(name)
    mod.RingExchangeOverlapCfg = mk("RingExchangeOverlapCfg", ring)
    mod.PipelineOverlapCfg = mk("PipelineOverlapCfg", [
        ("num_sm", int, ...), ("cga_size", int, ...), ("num_splits", int, ...), ("set_sm_margin", bool, ...),
        ("fp8_buf", bool, (False,)), *([("atomic_gemm", bool, False)] if bridge else []), ("method", str, "pipeline")])
    mod.BulkOverlapCfg = mk("BulkOverlapCfg", [("num_sm", int, ...), ("cga_size", int, ...),
                                               ("set_sm_margin", bool, ...), ("method", str, "bulk")])
    mod.TransformerLayerTPOverlapCfg = make_dataclass("TransformerLayerTPOverlapCfg", [(g, TPOverlapCfg) for g in GEMMS])
    for c in (mod.RingExchangeOverlapCfg, mod.PipelineOverlapCfg, mod.BulkOverlapCfg, mod.TransformerLayerTPOverlapCfg):
        c.__module__ = name
    return mod


@pytest.mark.parametrize("bridge", [True, False], ids=["megatron-bridge", "nemo2"])
def test_module_uses_the_library_classes_and_adds_the_knobs_they_lack(bridge, tmp_path, monkeypatch):
    target = ("megatron.bridge.training.comm_overlap" if bridge
              else "nemo.collections.llm.recipes.tp_overlap_configs.userbuffers")
    lib = _library(target, bridge=bridge)
    parts = target.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, target, lib)
    if not bridge:
        monkeypatch.setitem(sys.modules, "megatron.bridge.training.comm_overlap", None)   # ImportError
    cfgs = PIPELINE
    path = emit.write_bridge_overlap_py(tmp_path / emit.BRIDGE_FILE, cfgs, block_switches(cfgs))
    name = f"tuned_{'bridge' if bridge else 'nemo'}"
    mod = _load(path, name)
    monkeypatch.delitem(sys.modules, name)
    cfg = mod.tp_overlap_cfg
    assert isinstance(cfg, lib.TransformerLayerTPOverlapCfg)
    assert isinstance(cfg.proj_fprop, lib.PipelineOverlapCfg) and isinstance(cfg.qkv_dgrad, lib.BulkOverlapCfg)
    assert isinstance(cfg.qkv_fprop, lib.RingExchangeOverlapCfg)
    assert cfg.proj_fprop.fp8_buf is False                  # not the library's (False,), which TE reads as true
    assert type(cfg.qkv_fprop) is not lib.RingExchangeOverlapCfg     # use_ce (and, NeMo 2, cga_size) added
    ub = mod.ub_cfgs()
    assert _back(ub, _effective(cfgs)) == _effective(cfgs)   # every chosen knob reaches TE as chosen
    extra = {k: {kk for kk in v if kk not in _effective(cfgs)[k]} for k, v in ub.items()}
    assert all(ub[k][kk] is False for k, v in extra.items() for kk in v)   # the library's other fields: off
    sys.modules[name] = mod
    try:
        assert pickle.loads(pickle.dumps(cfg)) == cfg        # the added classes live in the module
    finally:
        del sys.modules[name]


def test_rederived_run_writes_the_module_beside_the_yaml(tmp_path):
    """decide writes tp_overlap_cfg_nemo.py beside tp_comm_overlap_cfg.yaml and the overrides (te runs)."""
    from tptune.cli.rederive import rederive
    from tptune.measure.preflight import resolve_here
    from tptune.records.run_dir import RunDir

    run = tmp_path / KNOBS.name
    shutil.copytree(KNOBS, run)
    (run / emit.BRIDGE_FILE).unlink(missing_ok=True)
    cfg = json.loads((run / "config.json").read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    rederive(resolve_here(cfg, base_dir=ROOT, check_hardware=False), RunDir(run))
    mod = _load(run / emit.BRIDGE_FILE, "tuned_rederived")
    chosen = _ints(yaml.safe_load((run / "tp_comm_overlap_cfg.yaml").read_text()))
    assert _back(mod.ub_cfgs()) == _effective(chosen)
    assert mod.model_overrides == yaml.safe_load((run / "transformer_config_overrides.yaml").read_text())
    assert mod.tp_overlap_cfg.qkv_wgrad is None and mod.tp_overlap_cfg.fc1_wgrad is None

"""Every committed run's tp_overlap_cfg_nemo.tp<N>.py (and one written here by tptune's writers with the FP8 knobs
no committed set holds) through the REAL Megatron-Bridge 0.3.1: imported against
Bridge's own TransformerLayerTPOverlapCfg / RingExchangeOverlapCfg / PipelineOverlapCfg / BulkOverlapCfg, its
model_overrides set on Bridge's GPTModelProvider (the model's shapes, TP N), passed through Bridge's
CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=...).finalize() / .setup(model, optimizer, ddp) and
MCore's TransformerConfig validation (model.finalize()); then the dict Bridge hands TE (model.tp_comm_overlap_cfg)
and the run's ub_cfgs.tp<N>.json are each given to Transformer Engine 2.20.2's own initialize_ub, and the
communicators TE would build from the two must be the same, argument for argument. That is how Bridge's extra
fields (fp8_buf, atomic_gemm on a ring exchange) and its PipelineOverlapCfg default fp8_buf=(False,) (a tuple,
which TE's `user_ub_cfg[name].get("fp8_buf", False) and ...` reads as true) are judged: as TE reads them.

Runs on megatron-core 0.16.1 (Bridge 0.3.1 pins megatron-core<0.17) and, when scripts/fetch_megatron_lm.sh has
run, on 0.19.2 (the GPU machines' bundle, which Bridge's pin excludes).

Neither Bridge nor megatron-core is a dependency of the test environment: scripts/fetch_megatron_bridge.sh unpacks
Bridge, megatron-core 0.16.1, omegaconf and TE's base.py into .cache/megatron-bridge (CI runs it); the check runs
in a subprocess (bridge_comm_overlap.py) with them on PYTHONPATH. What stands in there, and why, is in that
script's doc: Bridge's two package __init__ files are not run (they import transformer_engine.pytorch, whose CUDA
extension cannot be installed on a CPU host), comm_overlap.HAVE_TE is set True (Bridge turns TP overlap off when
`import transformer_engine` fails), and TE's C++ extension records the communicators' arguments."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from tptune.emit import configs as emit
from tptune.emit.megatron_switches import write_transformer_config_yaml
from tptune.model.ops import TE_GEMMS
from tptune.model.spec import FP8_RECIPES
from tptune.te.megatron_flags import block_switches

CACHE = ROOT / ".cache" / "megatron-bridge"          # scripts/fetch_megatron_bridge.sh
MEGATRON_LM = ROOT / ".cache" / "megatron-lm"       # scripts/fetch_megatron_lm.sh (megatron-core 0.19.2)
FETCHED = (CACHE / ".complete").is_file()
SKIP = pytest.mark.skipif(not FETCHED, reason="Megatron-Bridge 0.3.1 is not unpacked here: "
                                              "bash scripts/fetch_megatron_bridge.sh (CI runs it)")
NAMED = ("tp24-llama3-70b-h200x4/rep1", "confirm-mistral-small-24b-h200x4", "fp8-llama3-70b-h200x4-tp4",
         "fp8-current-llama3-70b-h200x4-tp4")
# Bridge's fields a ub_cfgs file of tptune's leaves out, as they reach TE: Bridge's defaults, but a pipeline's
# fp8_buf is the module's False (Bridge's default is the tuple (False,))
BRIDGE_EXTRA = {"ring_exchange": {"fp8_buf": False, "atomic_gemm": False},
                "pipeline": {"fp8_buf": False, "atomic_gemm": False}, "bulk": {}}


def _fp8_knobs(tmp_path: Path) -> dict:
    """The knobs no committed set holds, written by tptune's writers: FP8 Llama's TP 4 set with a pipelined
    proj_fprop given fp8_buf, a stream priority and pipeline_rs_overlap_first_gemm (fields Bridge's classes lack)
    and an atomic-GEMM ring-exchange pair (fc1_fprop, fc2_fprop)."""
    run = ROOT / "results" / "fp8-llama3-70b-h200x4-tp4"
    cfgs = json.loads((run / "ub_cfgs.tp4.json").read_text())
    cfgs["proj_fprop"] = {"method": "pipeline", "num_sm": 24, "cga_size": 2, "set_sm_margin": True, "num_splits": 4,
                          "fp8_buf": True, "comm_priority": -3, "pipeline_rs_overlap_first_gemm": True}
    for g in ("fc1_fprop", "fc2_fprop"):
        cfgs[g] = {**cfgs[g], "atomic_gemm": True}
    out = tmp_path / "fp8-knobs"
    out.mkdir()
    sw = block_switches(cfgs)
    emit.write_bridge_overlap_py(out / "tp_overlap_cfg_nemo.tp4.py", cfgs, sw, fp8=True)
    emit.write_ub_cfgs_json(out / "ub_cfgs.tp4.json", cfgs, fp8=True)
    write_transformer_config_yaml(out / "transformer_config_overrides.tp4.yaml", sw)
    spec = json.loads((run / "model.json").read_text())
    return {"id": "fp8_knobs", "run": "fp8-knobs (written here)", "module": str(out / "tp_overlap_cfg_nemo.tp4.py"),
            "tp": 4, "ub_cfgs": str(out / "ub_cfgs.tp4.json"),
            "overrides": str(out / "transformer_config_overrides.tp4.yaml"), "model": spec["model"],
            "seq_length": spec["workload"]["seq_length"], "micro_batch_size": spec["workload"]["micro_batch_size"],
            "fp8": True, "fp8_recipe": "delayed", "bare_bridge_classes": False}


def _items(tmp_path: Path) -> list[dict]:
    """Every committed tp_overlap_cfg_nemo.tp<N>.py with its ub_cfgs.tp<N>.json and model.json beside it, and
    _fp8_knobs's."""
    items = [_fp8_knobs(tmp_path)]
    for module in sorted((ROOT / "results").glob("**/tp_overlap_cfg_nemo.tp*.py")):
        tp = int(module.name.split(".tp")[1].removesuffix(".py"))
        run = module.parent
        spec = json.loads((run / "model.json").read_text())
        wl = spec["workload"]
        fp8 = wl["dtype"] == "fp8"
        name = str(run.relative_to(ROOT / "results"))
        items.append({"id": f"{name}_tp{tp}".translate(str.maketrans("/-.", "___")),
                      "run": name, "module": str(module), "tp": tp,
                      "ub_cfgs": str(run / f"ub_cfgs.tp{tp}.json"),
                      "overrides": str(run / f"transformer_config_overrides.tp{tp}.yaml"),
                      "model": spec["model"], "seq_length": wl["seq_length"],
                      "micro_batch_size": wl["micro_batch_size"],
                      "fp8": fp8, "fp8_recipe": FP8_RECIPES[wl["recipe"]][1] if fp8 else None,
                      "bare_bridge_classes": run.name == "confirm-mistral-small-24b-h200x4" and tp == 4})
    return items


_RESULTS: dict = {}


def _through_bridge(megatron_core: Path, tmp_path: Path) -> tuple[dict, dict]:
    """(what ran, {item id: (item, result)}): one subprocess for every item, once per megatron-core."""
    if megatron_core in _RESULTS:
        return _RESULTS[megatron_core]
    items = _items(tmp_path)
    listing = tmp_path / "items.json"
    listing.write_text(json.dumps(items))
    path = [str(megatron_core)] if megatron_core != CACHE / "site" else []
    env = {**os.environ, "TPTUNE_BRIDGE_SITE": str(CACHE / "site"),
           "TPTUNE_TE_BASE": str(CACHE / "te-2.20.2" / "base.py"),
           "PYTHONPATH": os.pathsep.join([*path, str(CACHE / "site"), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("bridge_comm_overlap.py")), str(listing)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    lines = p.stdout.splitlines()
    info = json.loads(next(x for x in lines if x.startswith("BRIDGE "))[7:])
    results = {r["id"]: r for r in (json.loads(x[7:]) for x in lines if x.startswith("RESULT "))}
    assert len(results) == len(items)
    _RESULTS[megatron_core] = info, {i["id"]: (i, results[i["id"]]) for i in items}
    return _RESULTS[megatron_core]


def _plain(v):
    """A value of the dict Bridge hands TE, as the subprocess wrote it (tuples and lists tagged)."""
    if isinstance(v, dict) and set(v) in ({"tuple"}, {"list"}):
        return tuple(map(_plain, v.get("tuple", v.get("list"))))
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


CORES = {"megatron-core-0.16.1": CACHE / "site", "megatron-core-0.19.2": MEGATRON_LM}


@SKIP
@pytest.mark.parametrize("core", CORES)
def test_emitted_module_through_bridges_comm_overlap_reaches_te_as_the_runs_ub_cfgs(core, tmp_path):
    if not (CORES[core] / "megatron" / "core").is_dir():
        pytest.skip(f"{CORES[core]} holds no megatron-core: bash scripts/fetch_megatron_lm.sh")
    info, results = _through_bridge(CORES[core], tmp_path)
    assert info["version"] == "0.3.1" and info["comm_overlap"].startswith(str(CACHE / "site"))
    assert info["megatron_core"].split("+")[0] == core.rsplit("-", 1)[1]
    assert info["megatron_core_file"].startswith(str(CORES[core]))
    assert info["had_te"] is False        # without TE, Bridge would turn TP overlap off: hence HAVE_TE = True
    runs = {i["run"] for i, _ in results.values()}
    assert set(NAMED) <= runs, sorted(runs)
    for key, (item, r) in results.items():
        written = json.loads(Path(item["ub_cfgs"]).read_text())
        # the module took Bridge's own classes; its added knobs live in subclasses of them
        assert all(r["classes"].values()), (key, r["classes"])
        for gemm, mro in r["gemms"].items():
            base = {"ring_exchange": "RingExchangeOverlapCfg", "pipeline": "PipelineOverlapCfg",
                    "bulk": "BulkOverlapCfg"}[written[gemm]["method"]]
            assert f"megatron.bridge.training.comm_overlap.{base}" in mro, (key, gemm, mro)
        # what setup hands TE: the file's GEMMs (None wgrads dropped), every knob the file sets, as it sets it,
        # and beside them only Bridge's own fields at values TE takes for its defaults
        handed = _plain(r["handed"])
        assert list(handed) != [] and set(handed) == set(written), key
        for gemm, entry in written.items():
            got = handed[gemm]
            assert {k: got.get(k) for k in entry} == entry, (key, gemm, got)
            extra = {k: v for k, v in BRIDGE_EXTRA[entry["method"]].items() if k not in entry}
            assert {k: v for k, v in got.items() if k not in entry} == extra, (key, gemm, got)
            assert all(type(got[k]) is type(v) for k, v in entry.items()), (key, gemm, got)
        # TE's initialize_ub builds the same communicators from either
        assert r["te_from_bridge"] == r["te_from_file"], key
        assert set(r["te_from_file"]) == {*TE_GEMMS, "proj_wgrad", "fc2_wgrad"}   # TE fills the rest itself
        # the switches: real TransformerConfig fields, set as the run's overrides file says, kept through setup
        assert r["not_fields"] == [], key
        overrides = yaml.safe_load(Path(item["overrides"]).read_text())
        assert {k: r["model"][k] for k in overrides} == overrides, key
        assert r["model"]["tp_comm_overlap"] is True and r["model"]["sequence_parallel"] is True
        assert r["model"]["tp_comm_bootstrap_backend"] == "nccl"    # Bridge's default; TE ran with gloo here
        if key == "fp8_knobs":     # TE honoured them: an FP8 buffer for the pipelined proj_fprop, the atomic pair
            te = r["te_from_bridge"]
            assert te["proj_fprop"]["buffer_dtype"] == "torch.uint8" and te["proj_fprop"]["comm_priority"] == -3
            assert te["proj_fprop"]["rs_overlap_first_gemm"] is True
            assert te["fc1_fprop"]["atomic_gemm"] is True and te["fc2_fprop"]["atomic_gemm"] is True
        # a checkpoint's run_config.yaml holds the config, and Bridge builds the same one from it
        assert r["run_config_round_trip"] is True, key


@SKIP
def test_the_comparison_sees_bridges_tuple_default_of_fp8_buf(tmp_path):
    """Control: Mistral's TP 4 set (its proj_fprop is pipelined) in Bridge's classes with only the file's knobs,
    as a user copying it by hand writes it, run as FP8: PipelineOverlapCfg's fp8_buf=(False,) reaches TE, which
    reads it as true and gives proj_fprop an FP8 (uint8) buffer. The emitted module sets fp8_buf=False: TE builds
    from it what it builds from the file."""
    _, results = _through_bridge(CACHE / "site", tmp_path)
    ((item, r),) = [v for v in results.values() if v[0]["bare_bridge_classes"]]
    c = r["control_fp8"]
    assert _plain(c["bare_handed"])["proj_fprop"]["fp8_buf"] == (False,)
    assert c["module"] == c["file"]
    assert {g for g in c["file"] if c["bare"][g] != c["file"][g]} == {"proj_fprop"}
    assert (c["bare"]["proj_fprop"]["buffer_dtype"], c["file"]["proj_fprop"]["buffer_dtype"]) == ("torch.uint8",
                                                                                                  "torch.bfloat16")

"""The te backend's FP8 path on CPU: the stand-in TE / Megatron-core modules of test_te_backend.py,
plus a stand-in te.autocast and TE recipe module that record their calls, on 2 gloo ranks. FP8 cases
must call initialize_ub with the FP8 quantization mode, run every forward (none, nocomm, ub and the
numerics reference) inside the autocast with the configured recipe and the TP group, and judge the
numerics at TE's FP8 tolerances."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch.distributed as dist
from test_te_backend import spawn_two_ranks, start_fake_te_rank

from tptune.cases import make_case
from tptune.model.spec import load_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "models" / "tiny.yaml"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _install_fp8_fakes(state: dict) -> None:
    from test_te_backend import _install_fakes

    _install_fakes(state)
    state.update({"autocasts": [], "active": None, "fwd": []})

    class Format:
        E4M3, HYBRID = "E4M3", "HYBRID"

    class _Recipe:
        def __init__(self, **kw):
            self.kw = kw

    recipes = {n: type(n, (_Recipe,), {}) for n in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                                                    "MXFP8BlockScaling", "NVFP4BlockScaling")}
    rmod = types.ModuleType("transformer_engine.common.recipe")
    rmod.Format = Format
    rmod.__dict__.update(recipes)
    common = types.ModuleType("transformer_engine.common")
    common.recipe = rmod
    sys.modules["transformer_engine.common"] = common
    sys.modules["transformer_engine.common.recipe"] = rmod
    sys.modules["transformer_engine"].common = common

    class autocast:
        def __init__(self, enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
            self.rec = {"enabled": enabled, "recipe": type(recipe).__name__, "kw": dict(recipe.kw),
                        "group": amax_reduction_group is not None}

        def __enter__(self):
            assert state["active"] is None, "nested autocast"
            state["active"] = self.rec
            state["autocasts"].append(self.rec)
            return self

        def __exit__(self, *exc):
            state["active"] = None

    te_pt = sys.modules["transformer_engine.pytorch"]
    te_pt.autocast = autocast
    ext = sys.modules["megatron.core.extensions.transformer_engine"]
    for cls in (ext.TELayerNormColumnParallelLinear, ext.TERowParallelLinear):
        def wrapped(self, x, _orig=cls.forward, _name=cls.__name__):
            state["fwd"].append((_name, state["active"] is not None and state["active"]["enabled"]))
            return _orig(self, x)
        cls.forward = wrapped


def _rank_main(rank, world, port, case_ids, workload, perturb, te_settings, q):
    try:
        from tptune.cases import parse_case_id
        from tptune.measure.worker.harness import run_case

        state, ctx = start_fake_te_rank(rank, world, port, perturb, _install_fp8_fakes)
        mc = load_model(TINY, workload)
        settings = {"backend": "te", "check": True, "te": te_settings,
                    "timing": {"warmup": 1, "iters": 2, "min_rounds": 2, "max_rounds": 2, "profile_steps": 0}}
        results = {}
        import tempfile
        with tempfile.TemporaryDirectory() as out:
            for cid in case_ids:
                state["fwd"].clear()
                res = run_case(parse_case_id(cid), mc, ctx, settings, Path(out) / cid)
                results[cid] = {"correctness": res["correctness"], "fwd": list(state["fwd"])}
        results["_state"] = {"inits": state["inits"], "autocasts": state["autocasts"][:3],
                             "n_autocasts": len(state["autocasts"])}
        dist.barrier()
        q.put((rank, "ok", json.loads(json.dumps(results, default=str))))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        import traceback
        q.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))


def _run(case_ids, workload, perturb=0.0, te_settings=None):
    return spawn_two_ranks(_rank_main, case_ids, workload, perturb, te_settings or {})


CASES = ["qkv-tp2-none", "qkv-tp2-nocomm", "proj-tp2-ub.nvidia_fp8_tp2", "fc1-tp2-ub.te"]


@pytest.mark.slow
def test_fp8_cases_use_fp8_userbuffers_autocast_and_fp8_tolerances():
    # perturb 0.03: within FP8's rounding (its unit roundoff 2^-4 floors the rule): passes as FP8
    got = _run(CASES, {"dtype": "fp8", "seq_length": 64, "recipe": "delayed"}, perturb=0.03)
    for rank, res in got.items():
        st = res["_state"]
        assert [i["modes"] for i in st["inits"]] == [["FP8"], ["FP8"]]
        assert st["inits"][0]["ub_cfgs"]["proj_fprop"]["method"] == "ring_exchange"   # NVIDIA's FP8 TP2 preset
        assert st["inits"][0]["dtype"] == "torch.bfloat16"                             # params stay bf16
        rec = st["autocasts"][0]
        assert rec == {"enabled": True, "recipe": "DelayedScaling", "group": True,
                       "kw": {"fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "max"}}
        for cid in CASES:
            fwd = res[cid]["fwd"]
            # every forward under the recipe, the FP8 reference included; the fp32 reference (last) outside it
            ub = "-ub." in cid
            assert fwd and all(inside for _, inside in (fwd[:-1] if ub else fwd)), (cid, fwd)
            assert fwd[-1][1] is not ub, (cid, fwd)
            corr = res[cid]["correctness"]
            assert corr["ok"] is True, (cid, corr)
            if "-ub." in cid:
                assert corr["precision"] == "fp8" and corr["reference"] == "fp32"
                # bf16 rounding of the +0.03: above bf16's rounding, within FP8's
                assert 0.001 < corr["tensors"]["output"]["max_abs"] <= 0.0625
        # the bound: the same Megatron-core layer under the same autocast
        assert [name for name, _ in res["qkv-tp2-nocomm"]["fwd"]] == ["TELayerNormColumnParallelLinear"] * len(
            res["qkv-tp2-nocomm"]["fwd"])


@pytest.mark.slow
def test_delayed_scaling_reference_runs_its_priming_passes():
    """Delayed scaling: the no-overlap reference runs REF_PRIME_ITERS fwd+bwd before the compared one
    (te_common.REF_PRIME_ITERS); current scaling is stateless and needs none."""
    from tptune.measure.worker.te_common import REF_PRIME_ITERS
    n = {}
    for recipe in ("delayed", "current"):
        res = _run(["proj-tp2-ub.te"], {"dtype": "fp8", "seq_length": 64, "recipe": recipe})[0]
        assert res["proj-tp2-ub.te"]["correctness"]["ok"] is True
        n[recipe] = len(res["proj-tp2-ub.te"]["fwd"])
    assert n["delayed"] - n["current"] == REF_PRIME_ITERS == 2


@pytest.mark.slow
def test_current_scaling_recipe_and_a_large_error_still_fails():
    got = _run(["proj-tp2-ub.te"], {"dtype": "e4m3", "seq_length": 64, "recipe": "current"}, perturb=0.5)
    res = got[0]
    assert res["_state"]["autocasts"][0]["recipe"] == "Float8CurrentScaling"
    assert res["_state"]["autocasts"][0]["kw"] == {"fp8_format": "E4M3"}
    corr = res["proj-tp2-ub.te"]["correctness"]
    assert corr["ok"] is False and "output" in corr["failed"]


def test_fp8_cases_rejected_before_anything_is_built():
    from tptune.measure.worker import te_backend, te_common

    te_common.REQUIRE_CUDA = False
    block = load_model(TINY, {"dtype": "fp8", "recipe": "block", "seq_length": 64})
    with pytest.raises(ValueError, match="cannot use userbuffers"):
        te_backend.check_case(make_case("fc1", 2, "ub.te"), block)
    te_backend.check_case(make_case("fc1", 2, "none"), block)
    emu = load_model(TINY, {"dtype": "fp8", "fp8_emulation": "bf16", "seq_length": 64})
    with pytest.raises(ValueError, match="fp8_emulation"):
        te_backend.check_case(make_case("fc1", 2, "none"), emu)
    delayed = load_model(TINY, {"dtype": "fp8", "seq_length": 64})
    # fp8_buf where TE ignores it, via a user's ub_cfgs file: refused before TE is imported
    from tptune.te.ubcfg import te_default_ub_cfgs

    bad = te_default_ub_cfgs()
    bad["qkv_fprop"]["fp8_buf"] = 1
    with pytest.raises(ValueError, match=r"qkv-tp2-ub.te: ub_cfgs: qkv_fprop: fp8_buf: TE ignores it"):
        te_common.check_ub_cfgs(bad, make_case("qkv", 2, "ub.te"), delayed, {})
    bad["qkv_fprop"] = {"method": "ring_exchange"}
    bad["fc1_fprop"] = {"method": "ring_exchange", "atomic_gemm": 1}
    with pytest.raises(ValueError, match="pairing rule"):
        te_common.check_ub_cfgs(bad, make_case("fc1", 2, "ub.te"), delayed, {"allow_atomic_gemm": True})
    with pytest.raises(ValueError, match="FP8 runs only"):
        te_common.check_ub_cfgs(bad, make_case("fc1", 2, "ub.te"), load_model(TINY, {"dtype": "bf16"}), {})


def test_recipe_objects_and_quantization_kwargs():
    from tptune.measure.worker.te_common import make_recipe, ub_quantization_kwargs

    class R:
        class Format:
            E4M3, HYBRID = "E4M3", "HYBRID"

    for n in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling"):
        setattr(R, n, type(n, (), {"__init__": lambda self, **kw: setattr(self, "kw", kw)}))
    w = lambda **kw: load_model(TINY, {"dtype": "fp8", **kw}).workload  # noqa: E731
    assert type(make_recipe(w(recipe="block"), R)).__name__ == "Float8BlockScaling"
    assert make_recipe(w(recipe="block"), R).kw == {"fp8_format": "E4M3"}
    assert type(make_recipe(w(recipe="mxfp8"), R)).__name__ == "MXFP8BlockScaling"
    assert make_recipe(w(recipe="nvfp4"), R).kw == {}
    assert make_recipe(load_model(TINY, {"dtype": "bf16"}).workload, R) is None

    class Mode:
        NONE, FP8 = "NONE", "FP8"
    assert ub_quantization_kwargs(types.SimpleNamespace(UserBufferQuantizationMode=Mode), True) == {
        "quantization_modes": ["FP8"]}
    assert ub_quantization_kwargs(types.SimpleNamespace(), True) == {"use_fp8": True}

"""A preset's recipe environment (te.ubcfg.preset_environment) is set while the TE bench builds the case's
modules (TE's LayerNormLinear / LayerNormMLP read the layernorm SM margins in their constructors) and
restored after, so the next case of the same worker builds without it."""
import os

import pytest

from tptune.cases import parse_case_id
from tptune.measure.worker.te_common import case_environment

VARS = ("NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN")


@pytest.fixture
def clean_env(monkeypatch):
    for v in VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("NVTE_BWD_LAYERNORM_SM_MARGIN", "4")   # the process's own value comes back
    return monkeypatch


def test_a_recipe_preset_builds_under_its_margins_and_restores_the_process_values(clean_env):
    with case_environment(parse_case_id("layer-tp2-ub.nemo_tp4_recipe"), {}) as env:
        assert env == {"NVTE_FWD_LAYERNORM_SM_MARGIN": "20", "NVTE_BWD_LAYERNORM_SM_MARGIN": "20"}
        assert [os.environ.get(v) for v in VARS] == ["20", "20"]
    assert os.environ.get("NVTE_FWD_LAYERNORM_SM_MARGIN") is None
    assert os.environ.get("NVTE_BWD_LAYERNORM_SM_MARGIN") == "4"


@pytest.mark.parametrize("case,te", [("layer-tp2-ub.nemo_tp4", {}), ("qkv-tp2-none", {}),
                                     ("layer-tp2-ub.nemo_tp4_recipe", {"ub_cfgs_file": "user.yaml"})])
def test_other_cases_build_in_the_process_environment(clean_env, case, te):
    with case_environment(parse_case_id(case), te) as env:
        assert env == {} and os.environ.get("NVTE_FWD_LAYERNORM_SM_MARGIN") is None


def test_the_environment_is_restored_when_the_build_fails(clean_env):
    with pytest.raises(RuntimeError):
        with case_environment(parse_case_id("fc1-tp2-ub.nvidia_bf16_tp2_recipe"), {}):
            raise RuntimeError("out of memory")
    assert os.environ.get("NVTE_FWD_LAYERNORM_SM_MARGIN") is None


def test_the_committed_recipe_environment_sessions_re_pool_to_their_figures():
    """results/recipe-env-h200x2: two verify sessions on 2x H200; the margins move neither preset (ties)
    and the pooled.json the benchmark wrote is what its sessions give."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("recipe_env", root / "benchmarks" / "recipe_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    folder = root / "results" / "recipe-env-h200x2"
    rows = mod.pooled(folder)
    assert rows == json.loads((folder / "pooled.json").read_text())
    by = {(r["a"], r["b"]): r for r in rows}
    for preset in ("nemo_tp4", "nvidia_bf16_tp2"):
        r = by[(f"ub.{preset}_recipe", f"ub.{preset}")]
        assert r["pooled_sessions"] == 2 and r["lo"] < 1.0 < r["hi"] and r["words"].startswith("tie")

"""Atomic GEMMs (TE's beta API) reach a worker only when the run opts in (search.atomic_gemm)."""
from tptune.cases import make_case
from tptune.measure.launch import Launcher
from tptune.measure.preflight import resolve_here

from conftest import base_config


def _te_settings(pool_dir, **search):
    s = resolve_here(base_config(pool_dir, search=search))
    launcher = Launcher(s)
    case = make_case("qkv", 2, "none")
    return launcher._settings_for(case, s.op("qkv").as_dict(), {}, profile=False, check=False)["te"]


def test_atomic_gemm_off_by_default(pool_dir):
    assert _te_settings(pool_dir)["allow_atomic_gemm"] is False


def test_atomic_gemm_opt_in(pool_dir):
    assert _te_settings(pool_dir, atomic_gemm=True)["allow_atomic_gemm"] is True

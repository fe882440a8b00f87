"""FP8 userbuffers knobs (``fp8_buf``, ``atomic_gemm``) and the FP8 startup checks.

Read from NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b (2.20.0.dev0):
transformer_engine/pytorch/module/base.py (initialize_ub, get_default_config, add_ub,
fill_userbuffers_buffer_for_all_gather) and transformer_engine/common/gemm/cublaslt_gemm.cu.

``fp8_buf`` (whether a GEMM's userbuffers communication buffer holds FP8 (uint8) data): initialize_ub
takes the user's value only for names in its ``methods["pipeline"]`` list, which holds proj_fprop and
fc2_fprop (TE's default method for them, whatever method the user gives: TE does not move them out
of that list) and qkv_dgrad/fc1_dgrad only when the user makes them a ``pipeline`` reduce-scatter.
Everywhere else TE sets the value itself and drops the user's: every all-gather overlap (qkv_fprop,
fc1_fprop, proj_dgrad, fc2_dgrad, the bulk qkv_dgrad/fc1_dgrad, the external proj_wgrad/fc2_wgrad)
gets an FP8 buffer in FP8 mode; the bulk reduce-scatters (qkv_wgrad, fc1_wgrad) and a ring-exchange
qkv_dgrad/fc1_dgrad never do. So an ``fp8_buf`` key there is refused: it would state something TE
does not do. An honoured ``fp8_buf: 1`` makes the GEMM write FP8 and reduce-scatter in FP8, which
needs a per-tensor-scaled FP8 GEMM output: delayed or current scaling (an MXFP8 GEMM has no FP8
output); in bf16 mode the key is ignored (buffer_dtype = dtype), so it is refused there too.

``atomic_gemm`` (cuBLAS atomic GEMM chunks; TE warns "Atomic GEMM uses a beta API from cublas and is
not tested for all use cases"): opt-in (``allow_atomic``); FP8 only (add_ub raises otherwise);
delayed scaling only (cublaslt_gemm.cu: "Atomic GEMM only supports delayed scaling."; it also needs
CUDA/cuBLAS >= 12.2 and < 13.0 at run time, which TE checks on the GPU); ignored for bulk overlaps
(add_ub warns and sets it to False), so refused there; and TE's pairing rule (add_ub): "atomic AG-GEMM
overlap with ring_exchange shuffles GEMM chunk outputs, and RS-GEMM overlap un-shuffles them": when
one of an AG/RS pair (qkv_fprop<->proj_fprop, fc1_fprop<->fc2_fprop) uses atomic_gemm with
ring_exchange, the other must use atomic_gemm with ring_exchange too.

Recipes and userbuffers: fill_userbuffers_buffer_for_all_gather handles no quantizer (bf16),
Float8Quantizer (delayed), Float8CurrentScalingQuantizer (current) and MXFP8Quantizer (mxfp8), and
raises "Unsupported quantizer for Userbuffers" for the rest: Float8BlockScaling (block) and NVFP4
cases therefore run none / nocomm only, never ub.*.

Wiring (the atomic pairs are ubcfg.ATOMIC_PAIRS): a ub_cfgs dict with FP8 knobs is checked with
``validate_ub_cfgs(strip_fp8_knobs(cfgs))`` (the bf16 rules, unchanged) then
``validate_fp8_ub_cfgs(cfgs, recipe=..., allow_atomic=...)``; a non-FP8 workload's ub_cfgs with
``check_no_fp8_knobs``.
"""
from __future__ import annotations

from tptune.model.spec import FP8_RECIPES, Workload, fp8_backend_problem, recipe_device_problem
from tptune.te.ubcfg import ATOMIC_PAIRS

FP8_KNOBS = ("fp8_buf", "atomic_gemm")
# initialize_ub's layers_all_gather_overlap (before a non-bulk qkv/fc1 dgrad moves to the RS list)
ALL_GATHER_GEMMS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad",
                    "fc2_dgrad", "fc2_wgrad")
UB_RECIPES = ("delayed", "current", "mxfp8")          # quantizers userbuffers can all-gather
FP8_BUF_RS_RECIPES = ("delayed", "current")            # per-tensor FP8 GEMM output
ATOMIC_RECIPES = ("delayed",)
RULE_PAIRING = "TE's atomic-GEMM pairing rule (initialize_ub add_ub)"


def _flag(where: str, knob: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{where}: {knob}={value!r}: expected true/false (or 0/1)")


def strip_fp8_knobs(cfgs: dict) -> dict:
    """``cfgs`` without fp8_buf/atomic_gemm (what today's ubcfg.validate_ub_cfgs checks)."""
    return {k: {kk: vv for kk, vv in v.items() if kk not in FP8_KNOBS} if isinstance(v, dict) else v
            for k, v in cfgs.items()}


def fp8_buf_honoured(name: str, method: str) -> bool:
    """Whether initialize_ub reads the user's fp8_buf for GEMM ``name`` with ``method``."""
    return name in ("proj_fprop", "fc2_fprop") or (name in ("qkv_dgrad", "fc1_dgrad") and method == "pipeline")


def _fp8_buf_reason(name: str, method: str) -> str:
    if name in ALL_GATHER_GEMMS and not (name in ("qkv_dgrad", "fc1_dgrad") and method != "bulk"):
        return ("TE ignores it there: initialize_ub gives every all-gather overlap an FP8 buffer in FP8 mode "
                "(fp8_buf = name in layers_all_gather_overlap), whatever the config says")
    return (f"TE ignores it there: initialize_ub reads fp8_buf only for pipeline reduce-scatters "
            f"(proj_fprop, fc2_fprop, or a pipeline qkv_dgrad/fc1_dgrad); {name} ({method}) never gets an FP8 buffer")


def validate_fp8_ub_cfgs(cfgs: dict, *, recipe: str, allow_atomic: bool) -> None:
    """Raise ValueError with the reason when an FP8 run's ub_cfgs asks for what TE does not do:
    a recipe userbuffers cannot carry, fp8_buf where TE ignores it (or where the recipe cannot use
    it), atomic_gemm without the opt-in, off delayed scaling, on a bulk overlap, or breaking TE's
    AG/RS pairing rule. Entries may be partial (a missing key takes TE's default: no FP8 knob)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"ub_cfgs: unknown FP8 recipe {recipe!r} (expected one of {', '.join(FP8_RECIPES)})")
    if not isinstance(cfgs, dict):
        raise ValueError(f"ub_cfgs: expected a mapping of GEMM name -> config, got {type(cfgs).__name__}")
    if cfgs and recipe not in UB_RECIPES:
        raise ValueError(f"ub_cfgs: recipe {recipe!r} ({FP8_RECIPES[recipe][0]}) cannot use userbuffers: TE's "
                         "fill_userbuffers_buffer_for_all_gather handles delayed, current and mxfp8 quantizers "
                         "only ('Unsupported quantizer for Userbuffers'); run none/nocomm, or another recipe")
    atomic_re: dict[str, bool] = {}
    for name, entry in cfgs.items():
        if not isinstance(entry, dict):
            raise ValueError(f"ub_cfgs: {name}: expected a mapping")
        method = entry.get("method")
        where = f"ub_cfgs: {name}"
        if "fp8_buf" in entry:
            if not fp8_buf_honoured(name, method):
                raise ValueError(f"{where}: fp8_buf: {_fp8_buf_reason(name, method)}; remove the key")
            if _flag(where, "fp8_buf", entry["fp8_buf"]) and recipe not in FP8_BUF_RS_RECIPES:
                raise ValueError(f"{where}: fp8_buf=1 makes the GEMM write FP8 and reduce-scatter in FP8, which "
                                 f"needs a per-tensor FP8 GEMM output (delayed or current scaling); recipe {recipe!r} "
                                 "has none")
        atomic = _flag(where, "atomic_gemm", entry.get("atomic_gemm", False))
        if atomic:
            if not allow_atomic:
                raise ValueError(f"{where}: atomic_gemm=1: atomic GEMM is a beta cuBLAS API in TE ('not tested for "
                                 "all use cases'); it is opt-in: enable it in the config to search or use it")
            if recipe not in ATOMIC_RECIPES:
                raise ValueError(f"{where}: atomic_gemm=1 needs delayed scaling (TE cublaslt_gemm.cu: 'Atomic GEMM "
                                 f"only supports delayed scaling'), recipe is {recipe!r}")
            if method in ("bulk", "external"):
                raise ValueError(f"{where}: atomic_gemm=1: TE ignores it for a {method} overlap (add_ub: 'atomic GEMM "
                                 "not is supported for a bulk overlap', it sets atomic_gemm=False)")
        atomic_re[name] = atomic and method == "ring_exchange"
    for ag, rs in ATOMIC_PAIRS:
        a, r = atomic_re.get(ag, False), atomic_re.get(rs, False)
        if a != r:
            on, off = (ag, rs) if a else (rs, ag)
            raise ValueError(
                f"ub_cfgs: {on} uses atomic_gemm with ring_exchange but its pair {off} does not: {RULE_PAIRING}: "
                f"the atomic ring-exchange AG-GEMM ({ag}) shuffles GEMM chunk outputs and the RS-GEMM ({rs}) "
                f"un-shuffles them, so with ring_exchange atomic_gemm must be set on both {ag} and {rs}")


def check_no_fp8_knobs(cfgs: dict, dtype: str) -> None:
    """A non-FP8 run's ub_cfgs must not carry FP8 knobs: TE raises for atomic_gemm outside FP8
    ("Atomic GEMM overlap supported only for FP8 GEMM") and ignores fp8_buf (bf16 buffers)."""
    for name, entry in (cfgs or {}).items():
        if isinstance(entry, dict):
            for knob in FP8_KNOBS:
                if knob in entry and _flag(f"ub_cfgs: {name}", knob, entry[knob]):
                    raise ValueError(f"ub_cfgs: {name}: {knob}=1 applies to FP8 runs only (dtype is {dtype}): "
                                     + ("TE's add_ub raises 'Atomic GEMM overlap supported only for FP8 GEMM'"
                                        if knob == "atomic_gemm" else "TE keeps a bf16 buffer and ignores it"))


def device_capability() -> tuple[int, int] | None:
    """The compute capability of cuda:0, or None without CUDA."""
    try:
        import torch

        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(0))
    except Exception:  # noqa: BLE001 - no usable CUDA: the GPU is unknown
        return None
    return None


def fp8_startup_problems(workload: Workload, backend: str, hardware: dict | None = None,
                         capability: tuple[int, int] | None = None) -> list[str]:
    """Config-time FP8 problems: the torch backend without the explicit bf16 emulation (one line),
    and a recipe the GPU cannot run (the compute capability when known, else hardware.gpu)."""
    if not workload.is_fp8:
        return []
    line = fp8_backend_problem(workload, backend)
    if line:
        return [line]
    if backend == "torch":   # bf16 emulation: no FP8 GEMMs, no recipe to check
        return []
    gpu = (hardware or {}).get("gpu")
    why = recipe_device_problem(workload.recipe, capability=capability, gpu=gpu)
    return [f"field 'workload.recipe': {why}"] if why else []

"""The te backend on a CPU machine: import guard, case checks, and the whole bench life cycle driven
through worker.harness on 2 gloo ranks with stand-in Transformer Engine / Megatron-core modules (plain
torch layers with the same constructor signatures and TP collectives). The real TE run is
scripts/gpu_smoke_te.py; its results are checked in tests/results/test_te_backend_gpu_fixtures.py."""
from __future__ import annotations

import enum
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tptune.cases import make_case
from tptune.model.spec import load_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "models" / "tiny.yaml"


# --- import guard --------------------------------------------------------------------------------

def test_module_imports_without_te_and_build_says_what_is_missing():
    """te_backend imports where TE/Megatron are absent; build() then raises ImportError naming them."""
    code = r"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('transformer_engine', 'megatron'):
            raise ImportError(f'blocked {name}')
sys.meta_path.insert(0, Block())
from tptune.measure.worker import te_backend, te_common
from tptune.measure.worker.harness import load_backend
assert load_backend('te') is te_backend
assert 'transformer_engine' not in sys.modules and 'megatron' not in sys.modules
import torch
from tptune.cases import make_case
from tptune.model.spec import load_model
from tptune.measure.worker.context import RankContext
te_common.REQUIRE_CUDA = False
mc = load_model(sys.argv[1], {'dtype': 'bf16'})
ctx = RankContext(0, 2, 0, torch.device('cpu'), None, None)
try:
    te_backend.build(make_case('qkv', 2, 'none'), mc, ctx, {})
except ImportError as exc:
    assert 'transformer_engine' in str(exc) and 'megatron' in str(exc), exc
    print('IMPORT-ERROR-OK')
"""
    res = subprocess.run([sys.executable, "-c", code, str(TINY)], capture_output=True, text=True, timeout=120)
    assert "IMPORT-ERROR-OK" in res.stdout, res.stdout + res.stderr


def test_check_case_names_what_the_backend_cannot_run():
    from tptune.measure.worker.te_backend import check_case

    mc = load_model(TINY, {"dtype": "bf16"})
    with pytest.raises(ValueError, match=r"chunked\.n4.*torch"):
        check_case(make_case("qkv", 2, "chunked.n4"), mc)
    with pytest.raises(ValueError, match="tp >= 2"):
        check_case(make_case("fc1", 1, "ub.te"), mc)
    with pytest.raises(ValueError, match="dtype"):
        check_case(make_case("fc1", 2, "ub.te"), load_model(TINY))  # tiny is fp32
    with pytest.raises(ValueError, match="seq_length"):
        check_case(make_case("fc1", 2, "none"), load_model(TINY, {"seq_length": 511, "dtype": "bf16"}))
    with pytest.raises(ValueError, match="2 ranks"):
        check_case(make_case("fc1", 2, "none"), mc, world_size=4)
    check_case(make_case("fc2", 2, "ub.te+fprop.pipe.sm8"), mc)
    check_case(make_case("proj", 1, "nocomm"), mc)


def test_bad_ub_knob_is_a_value_error_naming_the_gemm():
    from tptune.measure.worker import te_common

    # qkv_fprop all-gathers its input: TE has no pipeline method for it.
    with pytest.raises(ValueError, match="qkv_fprop"):
        te_common.preset_ub_cfgs(make_case("qkv", 2, "ub.te+fprop.pipe"))
    cfgs = te_common.preset_ub_cfgs(make_case("qkv", 2, "ub.te+dgrad.bulk.sm8.cga2"))
    assert cfgs["qkv_dgrad"]["method"] == "bulk" and cfgs["qkv_dgrad"]["num_sm"] == 8
    assert cfgs["qkv_dgrad"]["cga_size"] == 2 and len(cfgs) == 10


# --- stand-in TE / Megatron-core -------------------------------------------------------------------

class _AG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ws = dist.get_world_size()
        out = x.new_empty((ws * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((g.shape[0] // dist.get_world_size(), *g.shape[1:]))
        dist.reduce_scatter_tensor(out, g.contiguous())
        return out


class _RS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        return _AG.forward(None, g)


def _rms(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _install_fakes(state: dict) -> None:
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class Mode(enum.Enum):
        NONE = 0
        FP8 = 1

    def initialize_ub(shape, tp_size, use_fp8=False, quantization_modes=None, dtype=torch.bfloat16,
                      ub_cfgs=None, bootstrap_backend=None, with_cublasmp=False):
        if state["ub"] is not None:
            raise RuntimeError("UB communicators are already initialized.")
        state["ub"] = {"shape": list(shape), "tp_size": tp_size, "modes": [m.name for m in quantization_modes],
                       "dtype": str(dtype), "ub_cfgs": ub_cfgs}
        state["inits"].append(state["ub"])
        dist.new_group(backend="gloo")  # as TE's bootstrap group

    def destroy_ub():
        state["ub"] = None
        state["destroys"] += 1

    base = mod("transformer_engine.pytorch.module.base", initialize_ub=initialize_ub, destroy_ub=destroy_ub,
               is_ub_initialized=lambda: state["ub"] is not None, UserBufferQuantizationMode=Mode)

    class RMSNorm(torch.nn.Module):
        def __init__(self, n, *, eps=1e-5, device=None, dtype=None):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(n, device=device, dtype=dtype))

        def forward(self, x):
            return _rms(x, self.weight)

    class Linear(torch.nn.Module):
        def __init__(self, k, n, bias=True, params_dtype=None, device=None):
            super().__init__()
            assert not bias
            self.weight = torch.nn.Parameter(torch.empty(n, k, device=device, dtype=params_dtype))

        def forward(self, x):
            return x @ self.weight.t()

    module = mod("transformer_engine.pytorch.module", base=base)
    te_pt = mod("transformer_engine.pytorch", RMSNorm=RMSNorm, Linear=Linear, module=module)
    mod("transformer_engine", pytorch=te_pt)

    ps_state = {"tp": None}

    def initialize_model_parallel(tensor_model_parallel_size=1, create_gloo_process_groups=True):
        assert ps_state["tp"] is None, "initialize_model_parallel called twice"
        ps_state["tp"] = tensor_model_parallel_size
        state["mpu_inits"] += 1

    ps = mod("megatron.core.parallel_state", initialize_model_parallel=initialize_model_parallel,
             model_parallel_is_initialized=lambda: ps_state["tp"] is not None,
             get_tensor_model_parallel_world_size=lambda: ps_state["tp"])

    class TransformerConfig:
        def __init__(self, **kw):
            self.__dict__.update(kw)
            assert kw["sequence_parallel"] == (kw["tensor_model_parallel_size"] > 1)
            assert kw["add_bias_linear"] is False and kw["normalization"] == "RMSNorm"
            self.init_method = self.output_layer_init_method = lambda w: None

    class _Base(torch.nn.Module):
        def _check(self, config, name, bias, is_expert):
            assert not bias and not is_expert and name in ("qkv", "proj", "fc1", "fc2")
            self.ub = config.tp_comm_overlap
            self.tp = config.tensor_model_parallel_size
            state["layers"].append({"name": name, "overlap": self.ub, "cls": type(self).__name__,
                                    "rs_dgrad": getattr(config, "tp_comm_overlap_rs_dgrad", None)})

        def _maybe_perturb(self, out):
            if self.ub:
                assert state["ub"] is not None, "UB manager is not initialized."
                if state["perturb"]:
                    out = out + state["perturb"]
            return out

    class TELayerNormColumnParallelLinear(_Base):
        def __init__(self, k, n, *, config, init_method, gather_output, bias, skip_bias_add, is_expert,
                     tp_comm_buffer_name=None):
            super().__init__()
            self._check(config, tp_comm_buffer_name, bias, is_expert)
            assert not gather_output
            self.weight = torch.nn.Parameter(torch.empty(n // self.tp, k, dtype=config.params_dtype))
            self.layer_norm_weight = torch.nn.Parameter(torch.zeros(k, dtype=config.params_dtype))

        def forward(self, x):
            y = _rms(x, self.layer_norm_weight)
            if self.tp > 1:
                y = _AG.apply(y)
            return self._maybe_perturb(y @ self.weight.t()), None

    class TERowParallelLinear(_Base):
        def __init__(self, k, n, *, config, init_method, bias, input_is_parallel, skip_bias_add, is_expert,
                     tp_comm_buffer_name=None):
            super().__init__()
            self._check(config, tp_comm_buffer_name, bias, is_expert)
            assert input_is_parallel
            self.weight = torch.nn.Parameter(torch.empty(n, k // self.tp, dtype=config.params_dtype))

        def forward(self, x):
            y = x @ self.weight.t()
            if self.tp > 1:
                y = _RS.apply(y)
            return self._maybe_perturb(y), None

    ext = mod("megatron.core.extensions.transformer_engine",
              TELayerNormColumnParallelLinear=TELayerNormColumnParallelLinear,
              TERowParallelLinear=TERowParallelLinear)
    tc = mod("megatron.core.transformer.transformer_config", TransformerConfig=TransformerConfig)
    core = mod("megatron.core", parallel_state=ps, extensions=mod("megatron.core.extensions", transformer_engine=ext),
               transformer=mod("megatron.core.transformer", transformer_config=tc))
    mod("megatron", core=core)


def start_fake_te_rank(rank: int, world: int, port: int, perturb: float, install) -> tuple:
    """One gloo rank with the stand-in TE/Megatron modules of ``install(state)``: (state, RankContext)."""
    from tptune.measure.worker import te_common
    from tptune.measure.worker.context import RankContext

    state = {"ub": None, "inits": [], "destroys": 0, "mpu_inits": 0, "layers": [], "perturb": perturb}
    install(state)
    te_common.REQUIRE_CUDA = False
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return state, RankContext(rank, world, rank, torch.device("cpu"), dist.group.WORLD, dist.new_group(backend="gloo"))


def _rank_main(rank: int, world: int, port: int, case_ids: list, perturb: float, out_dir: str, q) -> None:
    try:
        from tptune.cases import parse_case_id
        from tptune.measure.worker.harness import run_case

        state, ctx = start_fake_te_rank(rank, world, port, perturb, _install_fakes)
        from torch.distributed import distributed_c10d as c10d
        n_groups = len(c10d._world.pg_map)
        mc = load_model(TINY, {"dtype": "bf16", "seq_length": 64})
        settings = {"backend": "te", "check": True,
                    "timing": {"warmup": 1, "iters": 2, "min_rounds": 2, "max_rounds": 2, "profile_steps": 0}}
        results = {}
        for cid in case_ids:
            case = parse_case_id(cid)
            res = run_case(case, mc, ctx, settings, Path(out_dir) / cid)
            results[cid] = {"n": len(res["samples"]["total_ms"]), "correctness": res["correctness"]}
        results["_state"] = {"inits": state["inits"], "destroys": state["destroys"],
                             "mpu_inits": state["mpu_inits"], "layers": state["layers"],
                             "ub_left": state["ub"] is not None,
                             "groups_leaked": len(c10d._world.pg_map) - n_groups}
        dist.barrier()
        q.put((rank, "ok", json.loads(json.dumps(results, default=str))))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        import traceback
        q.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))


def spawn_two_ranks(target, *args) -> dict:
    """Run ``target(rank, 2, port, *args, queue)`` on two spawned ranks; {rank: payload} when both say ok."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, 2, port, *args, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in procs:
            rank, status, payload = q.get(timeout=240)
            assert status == "ok", payload
            got[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


def _run_two_ranks(case_ids: list, tmp_path: Path, perturb: float = 0.0) -> dict:
    return spawn_two_ranks(_rank_main, case_ids, perturb, str(tmp_path))


CASES = ["qkv-tp2-none", "qkv-tp2-ub.te", "qkv-tp2-nocomm", "proj-tp2-ub.te", "proj-tp2-nocomm",
         "fc1-tp2-ub.te+dgrad.bulk.sm8.cga2", "fc2-tp2-none", "fc2-tp2-ub.nemo_tp4"]


@pytest.mark.slow
def test_bench_life_cycle_with_stand_in_te(tmp_path):
    got = _run_two_ranks(CASES, tmp_path)
    for rank, res in got.items():
        st = res["_state"]
        for cid in CASES:
            assert res[cid]["n"] == 2  # one round per request: iters timed iterations
            corr = res[cid]["correctness"]
            assert corr["ok"] is True, (cid, corr)
            if ".ub." in f".{cid.split('-', 2)[2]}":
                # against the fp32 layer, beside bf16 no overlap's errors: the stand-in overlap is exact
                assert corr["reference_block"].startswith("the same layer") and corr["reference"] == "fp32"
                assert set(corr["tensors"]) >= {"output", "input", "weight"}
                assert all(t["rel_l2"] == t["base_rel_l2"] and t["l2_ratio"] <= 1.0 for t in corr["tensors"].values())
        ub_cases = [c for c in CASES if "-ub." in c]
        # UB set up per case and torn down again; Megatron's parallel state once per process
        assert len(st["inits"]) == len(ub_cases) and st["destroys"] == len(ub_cases)
        assert not st["ub_left"] and st["mpu_inits"] == 1
        assert st["groups_leaked"] == 0
        first = st["inits"][0]
        assert first["shape"] == [64, 512] and first["tp_size"] == 2 and first["modes"] == ["NONE"]
        assert first["ub_cfgs"]["qkv_fprop"]["method"] == "ring_exchange" and len(first["ub_cfgs"]) == 10
        fc1 = st["inits"][2]["ub_cfgs"]["fc1_dgrad"]
        assert fc1 == {"method": "bulk", "num_sm": 8, "cga_size": 2, "set_sm_margin": 1}
        assert st["inits"][3]["ub_cfgs"]["proj_fprop"]["num_sm"] == 24  # the NeMo preset
        # each ub case: the overlapped layer, then the no-overlap references of correctness() (bf16, fp32)
        kinds = [(layer["name"], layer["overlap"], layer["cls"]) for layer in st["layers"]]
        assert kinds[:3] == [("qkv", False, "TELayerNormColumnParallelLinear"),
                             ("qkv", True, "TELayerNormColumnParallelLinear"),
                             ("qkv", False, "TELayerNormColumnParallelLinear")]
        assert ("proj", True, "TERowParallelLinear") in kinds
        # overlapped layers are built under Megatron's switches (megatron_flags.op_switches)
        assert {layer["rs_dgrad"] for layer in st["layers"] if layer["overlap"]} == {False}
        assert {layer["rs_dgrad"] for layer in st["layers"] if not layer["overlap"]} == {None}


@pytest.mark.slow
def test_correctness_flags_a_wrong_overlap(tmp_path):
    got = _run_two_ranks(["proj-tp2-ub.te"], tmp_path, perturb=0.5)
    corr = got[0]["proj-tp2-ub.te"]["correctness"]
    assert corr["ok"] is False and "output" in corr["failed"]
    assert corr["tensors"]["output"]["max_abs"] == pytest.approx(0.5, rel=0.05)   # against fp32: bf16's rounding too
    assert corr["tensors"]["output"]["l2_ratio"] > 10 * corr["factor_l2"]


def test_local_collectives_copy_locally_and_restore_torch_distributed():
    """nocomm's stand-ins: the rank's own shard into every slice (never an earlier tensor's: under FP8
    that could be the other format's bytes, tests/measure/test_local_collectives.py); the rank's slice of a
    reduce-scatter's input; torch.distributed's own functions back afterwards."""
    from tptune.measure.worker.te_backend import LocalCollectives

    world, rank = 4, 2
    local = LocalCollectives(rank, world)
    first, second = torch.randn(2, 1, 3), torch.randn(2, 1, 3)
    orig = dist.all_gather_into_tensor, dist.reduce_scatter_tensor
    with local.installed():
        assert dist.all_gather_into_tensor == local.all_gather_into_tensor
        out = torch.full((8, 1, 3), float("nan"))
        assert dist.all_gather_into_tensor(out, first) is None
        assert all(torch.equal(out[2 * r:2 * r + 2], first) for r in range(world))
        work = dist.all_gather_into_tensor(out, second, async_op=True)
        assert work.wait() and all(torch.equal(out[2 * r:2 * r + 2], second) for r in range(world))
        fp8_bytes = torch.randint(0, 255, (2, 3), dtype=torch.uint8)
        out8 = torch.zeros((8, 3), dtype=torch.uint8)
        dist.all_gather_into_tensor(out8, fp8_bytes)
        assert all(torch.equal(out8[2 * r:2 * r + 2], fp8_bytes) for r in range(world))
        z, rs = torch.randn(8, 1, 3), torch.empty(2, 1, 3)
        dist.reduce_scatter_tensor(rs, z)
        assert torch.equal(rs, z[4:6])
        with pytest.raises(RuntimeError, match="nocomm gather: output of 9 elements"):
            dist.all_gather_into_tensor(torch.empty(9), torch.empty(2))
    assert (dist.all_gather_into_tensor, dist.reduce_scatter_tensor) == orig


def _nocomm_rank(rank: int, world: int, port: int, q) -> None:
    try:
        from tptune.cases import parse_case_id
        from tptune.measure.worker import te_backend

        _, ctx = start_fake_te_rank(rank, world, port, 0.0, _install_fakes)
        mc = load_model(TINY, {"dtype": "bf16", "seq_length": 64})
        got = {}
        for op in ("qkv", "proj"):
            outs = {}
            for kind in ("none", "nocomm"):
                bench = te_backend.build(parse_case_id(f"{op}-tp2-{kind}"), mc, ctx, {})
                outs[kind] = bench.forward().detach().clone()
                bench.backward()
                outs[kind + "_xgrad"] = bench.x.grad.clone()
                if kind == "nocomm":
                    local_full = bench.x.detach() @ bench.layer.weight.detach().t()
                bench.close()
            half = outs["none"].shape[0] // (2 if op == "qkv" else 1)
            if op == "qkv":  # column: the rank's own token rows as with NCCL; the others from its frozen shard
                mine = slice(rank * half, (rank + 1) * half)
                got[op] = {"own_rows_equal": torch.equal(outs["nocomm"][mine], outs["none"][mine]),
                           "other_rows_are_frozen_shard": torch.equal(outs["nocomm"][:half], outs["nocomm"][half:]),
                           "none_rows_differ": not torch.equal(outs["none"][:half], outs["none"][half:])}
            else:  # row: the rank's slice of its own partial output, no sum over ranks
                n = outs["nocomm"].shape[0]
                got[op] = {"own_partial": torch.allclose(outs["nocomm"], local_full[rank * n:(rank + 1) * n]),
                           "not_the_sum": not torch.allclose(outs["nocomm"], outs["none"])}
            got[op]["grad_shape"] = list(outs["nocomm_xgrad"].shape) == list(outs["none_xgrad"].shape)
        q.put((rank, "ok", got))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        import traceback
        q.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))


@pytest.mark.slow
def test_nocomm_is_the_none_layer_with_local_collectives():
    got = spawn_two_ranks(_nocomm_rank)
    for rank, res in got.items():
        for op, checks in res.items():
            assert all(checks.values()), (rank, op, checks)



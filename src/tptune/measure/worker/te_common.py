"""What the te backend's op bench (te_backend) and block bench (te_block) share: TE and Megatron-core's
imports, the FP8 recipe and its context, the recipe against the GPU, the ub_cfgs a ub.* case builds
with and their checks, userbuffers' start and release, and the benches' common base (TeBench).

TE and Megatron are imported inside import_te() (a bench's construction), so this module imports on
machines without them. The FP8 handling is described in te_backend's docstring.
"""
from __future__ import annotations

import contextlib
import gc
import os
from abc import abstractmethod

import torch
import torch.distributed as dist
import yaml
from torch.profiler import record_function

from tptune.cases import Case
from tptune.measure.worker.bench import Bench
from tptune.measure.worker.context import RankContext
from tptune.model.spec import FP8_RECIPES, ModelConfig, recipe_device_problem
from tptune.te import fp8 as te_fp8
from tptune.te.ubcfg import case_ub_cfgs, preset_environment

# FP8 delayed scaling: fwd+bwd passes the no-overlap reference runs before it is compared. A reference
# given the layer's scaling state through load_state_dict (TE's pickled _extra_state) still quantized
# differently on x2: every overlapped setting of an op, presets included, differed from it by the same
# error, with weight gradients exactly equal (the weight's FP8 scale differed). So the reference builds
# its own state instead: the layer ran its warm-up and timed iterations on the same input, and two
# passes give the reference the same amax history maxima (the first pass at the initial scale, the
# second at the calibrated one); with TE's "max" over the history both then quantize alike.
REF_PRIME_ITERS = 2


def prime_reference(mc: ModelConfig, run_ref, x: torch.Tensor, grad_out: torch.Tensor, params) -> None:
    """Delayed scaling: REF_PRIME_ITERS fwd+bwd of the reference (``run_ref(x)``) on the same input,
    then its gradients cleared; nothing for stateless recipes."""
    if not (mc.workload.is_fp8 and mc.workload.recipe == "delayed"):
        return
    for _ in range(REF_PRIME_ITERS):
        run_ref(x.detach().clone().requires_grad_(True)).backward(grad_out)
    for p in params:
        p.grad = None


AMAX_REDUCE_MARK = "tptune.fp8.amax_reduce"
# make_recipe: DelayedScaling's history (TE's default; NeMo's bf16_with_fp8_mixed uses the same).
AMAX_HISTORY_LEN, AMAX_COMPUTE_ALGO = 1024, "max"
LAYERNORM_EPS = 1e-5
REQUIRE_CUDA = True   # tests switch this off to drive the code with stand-in TE/Megatron modules on CPU
_INSTALL_HINT = "the te backend needs transformer_engine (>= 2.0) and megatron-core (pip install '.[gpu]')"


def import_te():
    """(te, te_base, parallel_state, Megatron's TE extensions, TransformerConfig); ImportError naming what
    is missing."""
    try:
        import transformer_engine.pytorch as te  # noqa: F401
        from megatron.core import parallel_state
        from megatron.core.extensions import transformer_engine as mcore_te
        from megatron.core.transformer.transformer_config import TransformerConfig
        from transformer_engine.pytorch.module import base as te_base
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT}: {exc}") from exc
    return te, te_base, parallel_state, mcore_te, TransformerConfig


def import_recipe():
    try:
        from transformer_engine.common import recipe as te_recipe
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT}: {exc}") from exc
    return te_recipe


def make_recipe(workload, te_recipe=None):
    """The TE recipe object of an FP8 workload (None for other dtypes)."""
    if workload.dtype != "fp8":
        return None
    r = te_recipe or import_recipe()
    fmt = r.Format.E4M3 if workload.fp8_format == "e4m3" else r.Format.HYBRID
    cls = getattr(r, FP8_RECIPES[workload.recipe][0], None)
    if cls is None:
        raise ValueError(f"FP8 recipe {workload.recipe!r}: this Transformer Engine has no "
                         f"{FP8_RECIPES[workload.recipe][0]} (TE 2.20 has all of {', '.join(FP8_RECIPES)})")
    if workload.recipe == "delayed":
        return cls(fp8_format=fmt, amax_history_len=AMAX_HISTORY_LEN, amax_compute_algo=AMAX_COMPUTE_ALGO)
    if workload.recipe == "nvfp4":
        return cls()
    return cls(fp8_format=fmt)


def fp8_autocast(te, recipe, group):
    """TE's FP8 context: te.autocast (TE >= 2.8's name) or the deprecated te.fp8_autocast."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe, amax_reduction_group=group)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=group)


def ub_quantization_kwargs(te_base, fp8: bool) -> dict:
    """initialize_ub's quantization argument: [UserBufferQuantizationMode.FP8 or .NONE] (TE 2.20),
    or the deprecated use_fp8 on a TE without the enum."""
    mode = getattr(te_base, "UserBufferQuantizationMode", None)
    if mode is not None:
        return {"quantization_modes": [mode.FP8 if fp8 else mode.NONE]}
    return {"use_fp8": fp8}


def device_problem(case: Case, mc: ModelConfig, ctx: RankContext) -> str | None:
    """The recipe against this rank's GPU (compute capability from torch.cuda)."""
    w = mc.workload
    if w.dtype != "fp8" or not ctx.is_cuda:
        return None
    cc = tuple(torch.cuda.get_device_capability(ctx.device))
    why = recipe_device_problem(w.recipe, capability=cc, gpu=torch.cuda.get_device_name(ctx.device))
    return f"{case.id}: {why}" if why else None


_AMAX_MARKED = False


def mark_amax_reduction() -> None:
    """Run TE's amax all-reduce inside record_function(AMAX_REDUCE_MARK) (once per process; a TE
    without FP8GlobalStateManager.reduce_tensor_across_group_op_max is left alone)."""
    global _AMAX_MARKED
    if _AMAX_MARKED:
        return
    mgr = None
    for mod in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            mgr = getattr(__import__(mod, fromlist=["FP8GlobalStateManager"]), "FP8GlobalStateManager", None)
        except ImportError:
            continue
        if mgr is not None:
            break
    orig = getattr(mgr, "reduce_tensor_across_group_op_max", None) if mgr is not None else None
    if orig is None:
        return

    def reduce_marked(tensor, group):
        with record_function(AMAX_REDUCE_MARK):
            return orig(tensor, group)

    mgr.reduce_tensor_across_group_op_max = staticmethod(reduce_marked)
    _AMAX_MARKED = True


def load_yaml(path: str) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh)


def preset_ub_cfgs(case: Case, presets_dirs=None, mc: ModelConfig | None = None) -> dict:
    """A ub.* case's preset merged with its per-GEMM overrides (ValueError naming the bad GEMM/knob)."""
    return case_ub_cfgs(case, presets_dirs, workload=mc.workload.ub_rules if mc is not None else "bf16")


def check_ub_cfgs(cfgs: dict, case: Case, mc: ModelConfig, te_settings: dict) -> None:
    """The FP8 knobs of a case's ub_cfgs (search.fp8): before anything touches the GPU."""
    w = mc.workload
    try:
        if w.dtype == "fp8":
            te_fp8.validate_fp8_ub_cfgs(cfgs, recipe=w.recipe, allow_atomic=bool(te_settings.get("allow_atomic_gemm")))
        else:
            te_fp8.check_no_fp8_knobs(cfgs, w.dtype)
    except ValueError as exc:
        raise ValueError(f"{case.id}: {exc}") from None


def bench_ub_cfgs(case: Case, mc: ModelConfig, te_settings: dict) -> dict:
    """The ub_cfgs a ub.* case is built with, checked (a recipe userbuffers cannot carry, too): a user's
    --tp-comm-overlap-cfg YAML (te.ub_cfgs_file, passed to initialize_ub unchanged), else the case's
    preset (looked up in te.presets_dirs first) with its overrides."""
    path = te_settings.get("ub_cfgs_file")
    cfgs = load_yaml(path) if path else preset_ub_cfgs(case, te_settings.get("presets_dirs"), mc)
    check_ub_cfgs(cfgs, case, mc, te_settings)
    return cfgs


@contextlib.contextmanager
def case_environment(case: Case, te_settings: dict):
    """The environment a ub.* case's preset names (te.ubcfg.preset_environment: the layernorm SM margins
    of NVIDIA's recipes), set while the case's TE modules are built and restored after: LayerNormLinear
    and LayerNormMLP read it in their constructors, so it lasts as long as the modules. A user's
    --tp-comm-overlap-cfg file (te.ub_cfgs_file) names no environment."""
    env = ({} if case.variant.kind != "ub" or te_settings.get("ub_cfgs_file") else
           preset_environment(case.variant.preset, te_settings.get("presets_dirs")))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class TeBench(Bench):
    """What the op and block benches share: the CUDA requirement, TE's imports and the FP8 recipe, the
    recipe's context, userbuffers' start and release. A subclass sets case, mc, ctx, tp, dtype, fp8,
    te_settings and ub_cfgs before _load_te, and releases its modules in _teardown. A nocomm bench (the
    no-communication bound) sets ``local`` to its LocalCollectives; its forward runs under _collectives()."""
    local: LocalCollectives | None = None

    def _collectives(self):
        """nocomm: TE's TP collectives as local copies (LocalCollectives); else unchanged."""
        return self.local.installed() if self.local is not None else contextlib.nullcontext()

    def backward(self):
        with self._collectives():
            super().backward()

    def _require_cuda(self, case: Case, ctx: RankContext) -> None:
        if REQUIRE_CUDA and not ctx.is_cuda:
            raise ValueError(f"{case.id}: the te backend needs CUDA GPUs (use backend: torch on CPU)")

    def _load_te(self, case: Case, mc: ModelConfig, ctx: RankContext) -> None:
        """The recipe against the GPU, then TE and Megatron-core imported, the FP8 recipe built and TE's
        amax reduction marked; nothing built yet."""
        why = device_problem(case, mc, ctx)
        if why:
            raise ValueError(why)
        self.te, self.te_base, self.ps, self.mcore_te, self.TransformerConfig = import_te()
        self.recipe = make_recipe(mc.workload) if self.fp8 else None
        if self.fp8:
            mark_amax_reduction()
        self._ub_live, self._ub_groups = False, []

    def _autocast(self):
        """The FP8 recipe's context (a no-op context for other dtypes)."""
        if not self.fp8:
            return contextlib.nullcontext()
        return fp8_autocast(self.te, self.recipe, self.ctx.group)

    def _init_ub(self) -> None:
        """initialize_ub with the bench's ub_cfgs, recording the bootstrap process groups it creates so
        _release_ub can destroy them."""
        base = self.te_base
        if base.is_ub_initialized():  # left over from a case that failed before close()
            base.destroy_ub()
        w, h = self.mc.workload, self.mc.model.hidden_size
        kwargs = {"shape": [w.seq_length * w.micro_batch_size, h], "tp_size": self.tp, "dtype": self.dtype,
                  "ub_cfgs": self.ub_cfgs}
        kwargs.update(ub_quantization_kwargs(base, self.fp8))   # [FP8] or [NONE] (= use_fp8, undeprecated)
        if self.te_settings.get("bootstrap_backend"):
            kwargs["bootstrap_backend"] = self.te_settings["bootstrap_backend"]
        before = set(_pg_map())
        try:
            base.initialize_ub(**kwargs)
            self._ub_live = True
        finally:
            self._ub_groups = [pg for pg in _pg_map() if pg not in before]

    def _release_ub(self, collective: bool) -> None:
        """destroy_ub once every rank is done with the IPC-shared buffers, then the bootstrap groups."""
        if self._ub_live:
            if collective:
                self.ctx.sync()
                dist.barrier(group=self.ctx.cpu_group)
            self.te_base.destroy_ub()
        gc.collect()
        if collective:
            for pg in self._ub_groups:  # initialize_ub's bootstrap group: one more per case otherwise
                try:
                    dist.destroy_process_group(pg)
                except Exception:  # noqa: BLE001 - a leaked group only costs a few sockets
                    pass
        self._ub_live, self._ub_groups = False, []

    @abstractmethod
    def _teardown(self, collective: bool) -> None:
        """Drop the bench's modules and tensors, then _release_ub; ``collective``: every rank tears down
        (close), not only this failing one."""

    def close(self):
        self._teardown(collective=True)


def _pg_map() -> list:
    try:
        from torch.distributed import distributed_c10d as c10d
        return list(c10d._world.pg_map)
    except Exception:  # noqa: BLE001 - private API; without it the bootstrap groups just stay
        return []


def finite_result(test: dict, ctx: RankContext, checked: str) -> dict:
    """none/nocomm numerics: every tensor finite on every rank."""
    finite = all(bool(torch.isfinite(t).all()) for t in test.values())
    flag = torch.tensor([0.0 if finite else 1.0], device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.group)
    return {"ok": bool(flag.item() == 0.0), "reference": None, "checked": checked, "tensors": sorted(test)}


class _LocalWork:
    """The handle an async stand-in collective returns: already complete."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


class LocalCollectives:
    """nocomm: all_gather_into_tensor / reduce_scatter_tensor as local copies on one rank of ``world``.

    Gather: the rank's own shard into every slice, so every slice holds real, finite data of the
    tensor's own kind and nothing is read from another GPU. (A frozen copy of the first shard seen per
    dtype and size, as before, mixed FP8 formats: E4M3 bytes gathered into an E5M2 gradient decode as
    inf/NaN, and the FP8 block's bound failed its finite check.) Reduce-scatter: the rank's slice of its
    own input."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def all_gather_into_tensor(self, out, inp, group=None, async_op=False):
        src = inp.reshape(-1)
        if out.numel() != src.numel() * self.world:
            raise RuntimeError(f"nocomm gather: output of {out.numel()} elements for {self.world} shards "
                               f"of {src.numel()}")
        with record_function("tptune.nocomm.gather"):
            slices = out.view(self.world, -1)
            if slices[self.rank].data_ptr() != src.data_ptr():    # an in-place gather holds it already
                slices[self.rank].copy_(src)
            for r in range(self.world):
                if r != self.rank:
                    slices[r].copy_(slices[self.rank])
        return _LocalWork() if async_op else None

    def reduce_scatter_tensor(self, out, inp, op=None, group=None, async_op=False):
        if inp.numel() != out.numel() * self.world:
            raise RuntimeError(f"nocomm reduce-scatter: input of {inp.numel()} elements for {self.world} "
                               f"slices of {out.numel()}")
        with record_function("tptune.nocomm.scatter"):
            out.view(-1).copy_(inp.reshape(self.world, -1)[self.rank])
        return _LocalWork() if async_op else None

    @contextlib.contextmanager
    def installed(self):
        """torch.distributed's two functions replaced for the duration (TE looks them up per call)."""
        saved = dist.all_gather_into_tensor, dist.reduce_scatter_tensor
        dist.all_gather_into_tensor, dist.reduce_scatter_tensor = self.all_gather_into_tensor, self.reduce_scatter_tensor
        try:
            yield
        finally:
            dist.all_gather_into_tensor, dist.reduce_scatter_tensor = saved

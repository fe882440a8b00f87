"""Transformer Engine backend: one op of a GPT layer built exactly as Megatron-core builds it.

qkv / fc1  -> megatron.core.extensions.transformer_engine.TELayerNormColumnParallelLinear
proj / fc2 -> TERowParallelLinear
with ``tp_comm_buffer_name`` = the op's name, sequence parallelism on (TP > 1), bf16 params, no bias
(Llama), RMSNorm, under ``parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)``.

Variants:
  none     TransformerConfig(tp_comm_overlap=False): TE's NCCL all-gather / reduce-scatter, no overlap.
  ub.*     tp_comm_overlap=True and ``initialize_ub(shape=[seq*mbs, hidden], ub_cfgs=<the case's>)``
           (tptune.te.ubcfg.case_ub_cfgs: the preset merged with the case's per-GEMM overrides);
           ``destroy_ub()`` in close().
  nocomm   the no-communication bound: the `none` layer itself (same Megatron-core TE module, same
           norm, casts, FP8 quantization and amax reductions), with TE's two TP collectives replaced by
           local copies while the bench runs (LocalCollectives: torch.distributed.all_gather_into_tensor
           and reduce_scatter_tensor, which TE's distributed.py calls for bf16 and FP8 alike). A gather
           puts the rank's own shard into every slice (one FP8 format per tensor, always finite);
           a reduce-scatter keeps the rank's slice. So fprop/dgrad/wgrad run on exactly the shapes of
           ops.op_gemms, and under FP8 the local shard is quantized before the "gather" as TE does. The
           bound keeps the writes into the gathered buffer, at local-copy speed instead of NVLink's.

Layout (Megatron): activations are [s, b, h]; sequence parallelism splits s. Column ops take the
local [s/tp, b, hidden] input and return [s, b, out/tp]; row ops take [s, b, in/tp] and return
[s/tp, b, hidden]. Inputs and grad_out are random with fixed seeds; weights are random with std
1/sqrt(fan_in) (the same on every run, per rank), norm weights ones.

The warm worker server runs many cases in one process: Megatron's model-parallel state is set up
once per process; the userbuffers communicators (and the bootstrap process group initialize_ub
creates) are built per case and torn down in close(). TE and Megatron are imported when a bench is
built (te_common.import_te), so this module imports on machines without them. What the op and block
benches share is in te_common. settings["te"]["bootstrap_backend"] (optional:
gloo | nccl | mpi) is passed to initialize_ub; unset, TE picks (mpi if available, else gloo).

FP8 (workload dtype fp8; read from NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b,
2.20.0.dev0, and NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/fp8_utils.py):
  - params stay bf16; every variant (none, nocomm, ub.*) runs its forward under
    ``te.autocast(enabled=True, recipe=<recipe>, amax_reduction_group=<TP group>)`` (TE 2.20's name;
    ``te.fp8_autocast(enabled, fp8_recipe, fp8_group)`` is its deprecated alias, used only on a TE
    without ``autocast``), as Megatron's get_fp8_context does; backward runs outside it (TE keeps the
    recipe state in the autograd context). The recipe (``make_recipe``): delayed = DelayedScaling(
    fp8_format, amax_history_len=1024, amax_compute_algo="max") (TE's defaults, and NeMo's FP8 mixed
    precision), current = Float8CurrentScaling, block = Float8BlockScaling, mxfp8 = MXFP8BlockScaling,
    nvfp4 = NVFP4BlockScaling. The nocomm bound runs the same recipe and amax reduction group.
  - ub.*: ``initialize_ub(..., quantization_modes=[UserBufferQuantizationMode.FP8])`` (TE 2.20:
    module/base.py; ``use_fp8=True`` on a TE without the enum), after search.fp8.validate_fp8_ub_cfgs.
  - before anything is built, the recipe is checked against the GPU's compute capability
    (model.recipe_device_problem: MXFP8/NVFP4 need Blackwell).
  - numerics (stats.numerics): the overlapped layer and the no-overlap layer under the same recipe (given
    the layer's weights and, under delayed scaling, REF_PRIME_ITERS passes of its own to reach the same
    scaling state), both against the no-overlap layer in fp32.
  - TE's amax all-reduce (FP8GlobalStateManager.reduce_tensor_across_group_op_max, delayed scaling)
    runs inside ``record_function("tptune.fp8.amax_reduce")``, so a trace can tell it from TP
    communication (trace.classify AMAX_COMM).
"""
from __future__ import annotations

import math

import torch

from tptune.cases import Case
from tptune.measure.worker import numerics
from tptune.measure.worker.context import TORCH_DTYPES, RankContext
from tptune.measure.worker.te_common import (LAYERNORM_EPS, LocalCollectives, TeBench, bench_ub_cfgs, case_environment,
                                             finite_result, prime_reference)
from tptune.model.ops import parallel_kind, weight_shape
from tptune.model.spec import ModelConfig
from tptune.te.fp8 import UB_RECIPES
from tptune.te.megatron_flags import op_switches

KINDS = ("none", "nocomm", "ub")


def check_case(case: Case, mc: ModelConfig, world_size: int | None = None) -> None:
    """Raise ValueError naming what this backend cannot run (before anything is built)."""
    v = case.variant
    if v.kind not in KINDS:
        raise ValueError(f"{case.id}: variant {case.variant_id!r} is not a te-backend variant: the te "
                         f"backend runs none, nocomm and ub.<preset>[+...]; chunked.n<N> is torch-only "
                         f"(backend: torch)")
    if world_size is not None and world_size != case.tp:
        raise ValueError(f"{case.id}: needs a worker group of {case.tp} ranks, got {world_size}")
    w = mc.workload
    if w.dtype not in TORCH_DTYPES:
        raise ValueError(f"{case.id}: dtype {w.dtype!r} not supported (bf16, fp16, fp32, fp8)")
    if w.dtype == "fp8" and w.fp8_emulation:
        raise ValueError(f"{case.id}: fp8_emulation: {w.fp8_emulation} is the torch backend's; the te backend "
                         "runs FP8 itself (remove fp8_emulation)")
    if w.seq_length % case.tp:
        raise ValueError(f"{case.id}: seq_length={w.seq_length} is not divisible by tp={case.tp} "
                         "(sequence parallelism splits the sequence)")
    if v.kind == "ub":
        if case.tp < 2:
            raise ValueError(f"{case.id}: userbuffers overlap needs tp >= 2")
        if w.dtype not in ("bf16", "fp16", "fp8"):
            raise ValueError(f"{case.id}: userbuffers overlap runs bf16, fp16 or fp8, got dtype={w.dtype}")
        if w.dtype == "fp8":
            if w.recipe not in UB_RECIPES:
                raise ValueError(f"{case.id}: recipe {w.recipe!r} cannot use userbuffers (TE's "
                                 "fill_userbuffers_buffer_for_all_gather: delayed, current and mxfp8 only); "
                                 "run none/nocomm")


class TeOpBench(TeBench):
    """One op's Megatron-core TE layer on one rank (the bench interface of worker.harness)."""

    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, seed: int = 1234):
        check_case(case, mc, ctx.world_size)
        self._require_cuda(case, ctx)
        self.case, self.mc, self.ctx = case, mc, ctx
        self.kind = case.variant.kind
        self.te_settings = dict(settings.get("te") or {})
        self.tp, self.rank = case.tp, ctx.rank
        self.dtype = TORCH_DTYPES[mc.workload.dtype]
        self.fp8 = mc.workload.is_fp8
        self.column = parallel_kind(case.op) == "column"
        # settings["shape"]: one of the op's shapes under its communicator config (worker.harness)
        self.k_in, self.n_out = tuple(settings.get("shape") or weight_shape(case.op, mc))
        self.ub_cfgs = None
        if self.kind == "ub":  # validate before touching the GPU
            self.ub_cfgs = bench_ub_cfgs(case, mc, self.te_settings)
        self._load_te(case, mc, ctx)
        self.layer = None
        self.local = LocalCollectives(self.rank, self.tp) if self.kind == "nocomm" else None
        self.out = None
        try:
            self._ensure_model_parallel()
            if self.kind == "ub":
                self._init_ub()
            with case_environment(case, self.te_settings):
                self.layer = self._tp_layer(overlap=self.kind == "ub")
            self._init_params(seed)
            self._init_data(seed)
        except BaseException:
            self._teardown(collective=False)  # this rank is failing: the server exits after reporting
            raise

    # -- construction ---------------------------------------------------------------------------
    def _ensure_model_parallel(self) -> None:
        ps = self.ps
        if ps.model_parallel_is_initialized():
            have = ps.get_tensor_model_parallel_world_size()
            if have != self.tp:
                raise RuntimeError(f"{self.case.id}: Megatron model parallel state already set up for "
                                   f"tp={have} in this process")
            return
        ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, create_gloo_process_groups=False)

    def _config(self, overlap: bool, dtype: torch.dtype | None = None):
        m = self.mc.model
        dtype = dtype or self.dtype
        switches = {"tp_comm_overlap": False}
        if overlap:  # as Megatron would build this op's layer from the emitted switches
            switches = op_switches(self.case.op, self.ub_cfgs)
        return self.TransformerConfig(
            num_layers=1, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
            num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
            kv_channels=m.kv_channels, gated_linear_unit=m.gated_mlp, add_bias_linear=False,
            normalization="RMSNorm", layernorm_epsilon=LAYERNORM_EPS,
            tensor_model_parallel_size=self.tp, sequence_parallel=self.tp > 1, **switches,
            params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
            perform_initialization=False,  # weights are set from a fixed seed in _init_params
        )

    def _tp_layer(self, overlap: bool, dtype: torch.dtype | None = None):
        """The op's layer as Megatron's GPT layer builds it (attention.py / mlp.py)."""
        cfg = self._config(overlap, dtype)
        init = cfg.init_method
        if self.column:
            return self.mcore_te.TELayerNormColumnParallelLinear(
                self.k_in, self.n_out, config=cfg, init_method=init, gather_output=False, bias=False,
                skip_bias_add=self.case.op != "qkv", is_expert=False, tp_comm_buffer_name=self.case.op)
        return self.mcore_te.TERowParallelLinear(
            self.k_in, self.n_out, config=cfg, init_method=cfg.output_layer_init_method, bias=False,
            input_is_parallel=True, skip_bias_add=True, is_expert=False, tp_comm_buffer_name=self.case.op)

    def _params(self, layer=None) -> dict[str, torch.nn.Parameter]:
        """The weights of ``layer`` (default: the measured one) by name."""
        layer = layer if layer is not None else self.layer
        p = {"weight": layer.weight}
        if self.column:
            p["norm_weight"] = layer.layer_norm_weight
        return p

    def _init_params(self, seed: int) -> None:
        gen = torch.Generator(device=self.ctx.device).manual_seed(seed * 1000 + self.rank)
        with torch.no_grad():
            for name, p in self._params().items():
                if name == "weight":
                    p.normal_(0.0, 1.0 / math.sqrt(self.k_in), generator=gen)
                else:
                    p.fill_(1.0)

    def _init_data(self, seed: int) -> None:
        w = self.mc.workload
        s, b, tp = w.seq_length, w.micro_batch_size, self.tp
        if self.column:
            x_shape, out_shape = (s // tp, b, self.k_in), (s, b, self.n_out // tp)
        else:
            x_shape, out_shape = (s, b, self.k_in // tp), (s // tp, b, self.n_out)
        dev = self.ctx.device
        gen = torch.Generator(device=dev).manual_seed(seed + 17 * self.rank)
        self.x = torch.randn(x_shape, generator=gen, device=dev, dtype=self.dtype).requires_grad_(True)
        gen = torch.Generator(device=dev).manual_seed(99 + self.rank)
        self.grad_out = torch.randn(out_shape, generator=gen, device=dev, dtype=self.dtype)

    # -- the bench interface ----------------------------------------------------------------------
    def _run(self, x: torch.Tensor, layer=None) -> torch.Tensor:
        out = (layer if layer is not None else self.layer)(x)
        return out[0] if isinstance(out, tuple) else out

    def _autocast_run(self, x: torch.Tensor, layer=None) -> torch.Tensor:
        with self._autocast():
            return self._run(x, layer=layer)

    def forward(self):
        with self._collectives():
            self.out = self._autocast_run(self.x)
        return self.out

    def grad_params(self):
        return self._params().values()

    def gradients(self) -> dict[str, torch.Tensor]:
        return {"input": self.x.grad, **{k: p.grad for k, p in self._params().items()}}

    # -- correctness --------------------------------------------------------------------------------
    def correctness(self) -> dict:
        """ub: output and gradients against the no-overlap layer in fp32 (stats.numerics), beside the
        same-precision no-overlap layer's (tp_comm_overlap=False), all with the same weights, input and
        grad_out; worst over ranks. FP8 delayed scaling: the same-precision reference builds its scaling
        state from REF_PRIME_ITERS passes on the same input (the layer's came from its warm-up and timed
        iterations), so both quantize alike. none/nocomm: finite."""
        self.zero_grad()
        ref_layer = self._reference_layer() if self.kind == "ub" else None
        if ref_layer is not None:
            prime_reference(self.mc, lambda x, m=ref_layer: self._autocast_run(x, m), self.x, self.grad_out,
                            ref_layer.parameters())
        with self._collectives():
            out = self._autocast_run(self.x)
            out.backward(self.grad_out)
        test = {"output": out.detach(), **{k: g.detach() for k, g in self.gradients().items()}}
        self.zero_grad()
        del out
        if self.kind != "ub":
            return finite_result(test, self.ctx, "finite output and gradients")
        same = self._reference_tensors(ref_layer, autocast=True)
        precision = "fp8" if self.fp8 else numerics.TORCH_PRECISION[self.dtype]
        hp_dtype = numerics.higher_dtype(precision)
        hp = self._reference_tensors(self._reference_layer(hp_dtype), dtype=hp_dtype, autocast=False)
        del ref_layer
        base = numerics.errors(same, hp, self.ctx.group, self.ctx.device)
        res = numerics.verdict(test, base, hp, self.ctx.group, self.ctx.device, precision,
                               reference=f"the same layer with tp_comm_overlap=False in {numerics.HIGHER[precision]}")
        self.ctx.sync()
        return res

    def _reference_tensors(self, layer, *, dtype: torch.dtype | None = None, autocast: bool) -> dict:
        """Output, input gradient and weight gradients of a no-overlap ``layer`` on this bench's data."""
        x_ref = self.x.detach().to(dtype or self.x.dtype).requires_grad_(True)
        out_ref = self._autocast_run(x_ref, layer) if autocast else self._run(x_ref, layer)
        out_ref.backward(self.grad_out.to(dtype or self.grad_out.dtype))
        return {"output": out_ref.detach(), "input": x_ref.grad,
                **{k: p.grad for k, p in self._params(layer).items()}}

    def _reference_layer(self, dtype: torch.dtype | None = None):
        """The no-overlap layer with this layer's weights, in ``dtype`` (default: the measured one)."""
        ref_layer = self._tp_layer(overlap=False, dtype=dtype)
        with torch.no_grad():
            ref_params = self._params(ref_layer)
            for k, p in self._params().items():
                ref_params[k].copy_(p)
        return ref_layer

    # -- teardown -------------------------------------------------------------------------------------
    def _teardown(self, collective: bool) -> None:
        self.out = None
        self.layer = self.local = None
        self.x = self.grad_out = None
        self._release_ub(collective)


def copy_module_state(dst, src) -> None:
    """``dst`` takes ``src``'s parameters and buffers, not TE's ``_extra_state`` (FP8 scaling state, a
    pickle that TE 2.20 refuses to load without NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1, and which did
    not take effect anyway: REF_PRIME_ITERS)."""
    state = {k: v for k, v in src.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    params = dict(dst.named_parameters())
    wrong = [k for k in missing if k in params] + [k for k in unexpected if k in dict(src.named_parameters())]
    if wrong:
        raise RuntimeError(f"reference module does not match the measured one: {wrong[:5]}")


def build(case: Case, mc: ModelConfig, ctx: RankContext, settings: dict):
    """One op's bench (the layer stage's block: harness.build_bench)."""
    return TeOpBench(case, mc, ctx, settings)

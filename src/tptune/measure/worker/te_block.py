"""A whole transformer block on the te backend: Megatron-core's TransformerBlock with the TE layer spec.

An MoE model's block has its MoE layers (``_moe_config``; untested on a GPU yet: scripts/gpu_moe_block_tp1.py
checks the builder at TP 1). Case "layer-tp<N>-<variant>": ``num_layers`` (settings["layer"]["num_layers"], default 2) GPT layers
of the model's real shapes (attention included: TE's fused attention, causal, GQA; gated MLP; RMSNorm;
no bias), sequence parallel, bf16. Variants: ``none`` (tp_comm_overlap off: TE's NCCL collectives)
and ``ub.<preset>`` (tp_comm_overlap on, initialize_ub with the preset's full ten-GEMM ub_cfgs; the
preset is looked up in settings["te"]["presets_dirs"] first, so a run's tuned combination or a
user's --tp-comm-overlap-cfg file is measured as it is). fwd+bwd of the block is what is timed,
through the same harness as the per-op cases.

Megatron's TP-overlap switches (tp_comm_overlap_rs_dgrad, bulk, disable_*) come from the ub_cfgs through
search.megatron_flags.block_switches, the function that writes transformer_config_overrides.yaml, so the
block is built as the emitted flags build it.

correctness(): the overlapped block against a block with tp_comm_overlap off, same weights (state
dict copied), input and grad_out: output and input gradient at TE's layer criterion (te_backend), the
reference run twice so that its own pass-to-pass difference (attention backward is not deterministic)
sets a floor under the check (te_backend.FLOOR_FACTOR).

FP8 (workload dtype fp8): TransformerConfig gets Megatron's FP8 fields (fp8=<format>,
fp8_recipe=<delayed|tensorwise|blockwise|mxfp8>, or fp4="e2m1"/fp4_recipe="nvfp4"; delayed with
fp8_amax_history_len=1024, fp8_amax_compute_algo="max", the parameters of te_backend.make_recipe),
so Megatron's TransformerBlock enters its own get_fp8_context as in training; the block's forward
also runs under te_backend.fp8_autocast with the same recipe (the context Megatron's fp8_autocast
wraps; nested, Megatron's inner one is the active one, with identical parameters). ub.*: initialize_ub
with quantization_modes=[FP8] after search.fp8.validate_fp8_ub_cfgs. Numerics at TE's FP8 tolerances,
the reference given the block's weights and, under delayed scaling, its own priming passes
(te_backend.REF_PRIME_ITERS) before either runs. Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553: transformer_config.py (fp8, fp8_recipe,
fp8_amax_history_len, fp8_amax_compute_algo, fp4, fp4_recipe), fp8_utils.py (get_fp8_recipe,
get_fp8_context).
"""
from __future__ import annotations

import torch

from tptune.cases import Case
from tptune.model.spec import ModelConfig
from tptune.measure.worker.context import TORCH_DTYPES, RankContext
from tptune.measure.worker import te_backend as _tb
from tptune.measure.worker.te_backend import (ATOL_FP8, ATOL_LAYER, LAYERNORM_EPS, RTOL_FP8, RTOL_LAYER, _import_te, _load_yaml, _ub_cfgs, check_ub_cfgs, device_problem, finite_result, make_recipe, mark_amax_reduction, reference_result, release_ub, start_ub)

DEFAULT_LAYERS = 2
_SEEDED = False


def _seed_rng(seed: int) -> None:
    """Megatron's model-parallel RNG tracker (TE attention forks it); once per process."""
    global _SEEDED
    if _SEEDED:
        return
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    model_parallel_cuda_manual_seed(seed)
    _SEEDED = True


class TeBlockBench(_tb._TeBench):
    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, seed: int = 1234):
        if case.variant.kind not in ("none", "ub"):
            raise ValueError(f"{case.id}: a layer case is none or ub.<preset> on the te backend")
        if _tb.REQUIRE_CUDA and not ctx.is_cuda:
            raise ValueError(f"{case.id}: the te backend needs CUDA GPUs (use backend: torch on CPU)")
        if ctx.world_size != case.tp:
            raise ValueError(f"{case.id}: needs a worker group of {case.tp} ranks, got {ctx.world_size}")
        w = mc.workload
        if w.seq_length % case.tp:
            raise ValueError(f"{case.id}: seq_length={w.seq_length} is not divisible by tp={case.tp}")
        self.case, self.mc, self.ctx, self.tp = case, mc, ctx, case.tp
        self.te_settings = dict(settings.get("te") or {})
        self.layers = int((settings.get("layer") or {}).get("num_layers", DEFAULT_LAYERS))
        self.dtype = TORCH_DTYPES[w.dtype]
        self.fp8 = w.is_fp8
        self.rtol, self.atol = (RTOL_FP8, ATOL_FP8) if self.fp8 else (RTOL_LAYER, ATOL_LAYER)
        self.overlap = case.variant.kind == "ub"
        self.ub_cfgs, self.switches = None, None
        if self.overlap:
            path = self.te_settings.get("ub_cfgs_file")
            self.ub_cfgs = _load_yaml(path) if path else _ub_cfgs(case, self.te_settings.get("presets_dirs"), mc)
            check_ub_cfgs(self.ub_cfgs, case, mc, self.te_settings)   # a recipe userbuffers cannot carry, too
            from tptune.te.megatron_flags import block_switches
            try:   # what the emitted transformer_config_overrides.yaml holds for this ub_cfgs
                self.switches = block_switches(self.ub_cfgs)
            except ValueError as exc:
                raise ValueError(f"{case.id}: Megatron's switches cannot build this block: {exc}") from None
        why = device_problem(case, mc, ctx)
        if why:
            raise ValueError(why)
        self.te, self.te_base, self.ps, self.mcore_te, self.TransformerConfig = _import_te()
        self.recipe = make_recipe(w) if self.fp8 else None
        if self.fp8:
            mark_amax_reduction()
        self._ub_live, self._ub_groups = False, []
        self.block = None
        try:
            if not self.ps.model_parallel_is_initialized():
                self.ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, create_gloo_process_groups=False)
            elif self.ps.get_tensor_model_parallel_world_size() != self.tp:
                raise RuntimeError(f"{case.id}: Megatron model parallel state set up for another TP")
            _seed_rng(seed)
            if self.overlap:
                self._init_ub()
            torch.manual_seed(seed)
            self.block = self._build(self.overlap)
            gen = torch.Generator(device=ctx.device).manual_seed(seed + 17 * ctx.rank)
            shape = (w.seq_length // self.tp, w.micro_batch_size, mc.model.hidden_size)
            self.x = torch.randn(shape, generator=gen, device=ctx.device, dtype=self.dtype).requires_grad_(True)
            self.grad_out = torch.randn(shape, generator=gen, device=ctx.device, dtype=self.dtype)
            self.out = None
        except BaseException:
            self._teardown(collective=False)
            raise

    def _config(self, overlap: bool):
        m = self.mc.model
        return self.TransformerConfig(
            num_layers=self.layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
            num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
            kv_channels=m.kv_channels, gated_linear_unit=m.gated_mlp,
            activation_func=torch.nn.functional.silu if m.gated_mlp else torch.nn.functional.gelu,
            add_bias_linear=False, bias_activation_fusion=False, normalization="RMSNorm",
            layernorm_epsilon=LAYERNORM_EPS, attention_dropout=0.0, hidden_dropout=0.0,
            tensor_model_parallel_size=self.tp, sequence_parallel=self.tp > 1,
            **(self.switches if overlap else {"tp_comm_overlap": False}),
            params_dtype=self.dtype, bf16=self.dtype == torch.bfloat16, fp16=self.dtype == torch.float16,
            **self._fp8_config(), **self._moe_config())

    def _moe_config(self) -> dict:
        """An MoE model's block (ModelSpec.block_pattern: a dense first layer when the model has dense
        layers, then MoE layers): Megatron-core's MoE layer with its router, routed experts (grouped GEMM,
        alltoall dispatcher, expert-TP = TP) and shared expert; no aux loss, so the timing is the layer's."""
        m = self.mc.model
        if not m.is_moe:
            return {}
        out = {"num_moe_experts": m.num_moe_experts, "moe_router_topk": m.moe_router_topk,
               "moe_ffn_hidden_size": m.moe_ffn_hidden_size, "moe_token_dispatcher_type": "alltoall",
               "moe_grouped_gemm": True, "moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0,
               "moe_layer_freq": [int(x) for x in m.block_pattern(self.layers)]}
        if m.moe_shared_expert_intermediate_size:
            out["moe_shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size
        return out

    def _fp8_config(self) -> dict:
        """Megatron's FP8 (or FP4) TransformerConfig fields for the workload's recipe."""
        if not self.fp8:
            return {}
        from tptune.measure.worker.te_backend import AMAX_COMPUTE_ALGO, AMAX_HISTORY_LEN
        from tptune.model.spec import FP8_RECIPES

        w = self.mc.workload
        if w.recipe == "nvfp4":
            return {"fp4": "e2m1", "fp4_recipe": "nvfp4"}
        return {"fp8": w.fp8_format, "fp8_recipe": FP8_RECIPES[w.recipe][1],
                "fp8_amax_history_len": AMAX_HISTORY_LEN, "fp8_amax_compute_algo": AMAX_COMPUTE_ALGO}

    def _build(self, overlap: bool):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = self._config(overlap)
        if self.mc.model.is_moe:   # per-layer specs: dense and MoE layers as moe_layer_freq lays them out
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True)
        else:
            spec = get_gpt_layer_with_transformer_engine_spec()
        block = TransformerBlock(config, spec, post_layer_norm=False)
        return block.to(device=self.ctx.device)

    def _init_ub(self) -> None:
        start_ub(self)

    def _run(self, block, x):
        with self._autocast():
            out = block(hidden_states=x, attention_mask=None)
        return out[0] if isinstance(out, tuple) else out

    def forward(self):
        self.out = self._run(self.block, self.x)
        return self.out

    def _grad_params(self):
        return self.block.parameters()

    def correctness(self) -> dict:
        self.zero_grad()
        ref = None
        if self.overlap:   # the block's weights; FP8 scaling state from priming passes (te_backend.REF_PRIME_ITERS)
            ref = self._build(False)
            _tb.copy_module_state(ref, self.block)
            _tb.prime_reference(self.mc, lambda x, m=ref: self._run(m, x), self.x, self.grad_out, ref.parameters())
        out = self._run(self.block, self.x)
        out.backward(self.grad_out)
        test = {"output": out.detach(), "input": self.x.grad.detach()}
        self.zero_grad()
        del out
        if not self.overlap:
            return finite_result(test, self.ctx, "finite output and input gradient")
        refs, again = self._reference_pass(ref), self._reference_pass(ref)   # twice: the floor (FLOOR_FACTOR)
        del ref
        res = reference_result(test, refs, self.ctx, rtol=self.rtol, atol=self.atol,
                               reference="same block with tp_comm_overlap=False", source="run_layer_with_overlap",
                               recipe=self.mc.workload.recipe if self.fp8 else None, ref_again=again)
        self.ctx.sync()
        return res

    def _reference_pass(self, ref) -> dict:
        x_ref = self.x.detach().clone().requires_grad_(True)
        out_ref = self._run(ref, x_ref)
        out_ref.backward(self.grad_out)
        got = {"output": out_ref.detach(), "input": x_ref.grad.detach()}
        for p in ref.parameters():
            p.grad = None
        return got

    def close(self):
        self._teardown(collective=True)

    def _teardown(self, collective: bool) -> None:
        self.out = self.block = None
        self.x = self.grad_out = None
        release_ub(self.te_base, self.ctx, self._ub_live, self._ub_groups, collective)
        self._ub_live, self._ub_groups = False, []

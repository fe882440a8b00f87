"""A whole transformer block on the te backend: Megatron-core's TransformerBlock with the TE layer spec.

An MoE model's block has its MoE layers (``_moe_config``; untested on a GPU yet: scripts/gpu_moe_block_tp1.py
checks the builder at TP 1). Case "layer-tp<N>-<variant>": ``num_layers`` (settings["layer"]["num_layers"], default 2) GPT layers
of the model's real shapes (attention included: TE's fused attention, causal, GQA; gated MLP; RMSNorm;
no bias), sequence parallel, bf16. Variants: ``none`` (tp_comm_overlap off: TE's NCCL collectives),
``nocomm`` (the block's no-communication bound: ``none`` with TE's TP collectives as local copies while it
runs, te_common.LocalCollectives; its numerics are only checked finite) and ``ub.<preset>`` (tp_comm_overlap on, initialize_ub with the preset's full ten-GEMM ub_cfgs; the
preset is looked up in settings["te"]["presets_dirs"] first, so a run's tuned combination or a
user's --tp-comm-overlap-cfg file is measured as it is). fwd+bwd of the block is what is timed,
through the same harness as the per-op cases.

Megatron's TP-overlap switches (tp_comm_overlap_rs_dgrad, bulk, disable_*) come from the ub_cfgs through
search.megatron_flags.block_switches, the function that writes transformer_config_overrides.yaml, so the
block is built as the emitted flags build it; te.preset_switches (tptune verify --pair) builds a named
preset under switches given as they are, to show what a mismatched pair does.

correctness(): stats.numerics' rule. The block with tp_comm_overlap off in fp32 (same weights, input and
grad_out) is the reference; this setting's output, input gradient and every weight gradient must err
against it like the same-precision no-overlap block does (two bf16 answers of different reduction
orders differ beyond TE's pairwise tolerances at TP 4 by rounding alone: issue 33).

FP8 (workload dtype fp8): TransformerConfig gets Megatron's FP8 fields (fp8=<format>,
fp8_recipe=<delayed|tensorwise|blockwise|mxfp8>, or fp4="e2m1"/fp4_recipe="nvfp4"; delayed with
fp8_amax_history_len=1024, fp8_amax_compute_algo="max", the parameters of te_common.make_recipe),
so Megatron's TransformerBlock enters its own get_fp8_context as in training; the block's forward
also runs under te_common.fp8_autocast with the same recipe (the context Megatron's fp8_autocast
wraps; nested, Megatron's inner one is the active one, with identical parameters). ub.*: initialize_ub
with quantization_modes=[FP8] after search.fp8.validate_fp8_ub_cfgs. Numerics: FP8 against FP8 no
overlap (given the block's weights and, under delayed scaling, its own priming passes,
te_common.REF_PRIME_ITERS), both against the fp32 block. Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553: transformer_config.py (fp8, fp8_recipe,
fp8_amax_history_len, fp8_amax_compute_algo, fp4, fp4_recipe), fp8_utils.py (get_fp8_recipe,
get_fp8_context).

Packed THD input ("layer-tp<N>-pack<T>.b<k>-<variant>", worker.packed): the block is built for seq_length T,
micro-batch 1 (userbuffers for T x hidden), its input [T / TP, 1, hidden] per rank (sequence parallel), and
TransformerBlock.forward gets PackedSeqParams(qkv_format="thd", cu_seqlens_q = cu_seqlens_kv = the
segments' offsets [0, l1, ..., sum, T], the *_padded ones the same tensors, max_seqlen = the longest
segment), as GPTModel.forward hands its packed_seq_params to its decoder. Megatron's SelfAttention then
squeezes the batch dimension and TEDotProductAttention turns the layer spec's causal mask into
padding_causal for THD: attention causal within each segment. The padding is a segment of its own
(Megatron-RL's bins: cu_seqlens end at the bin size) and the padded offsets are the unpadded tensors
themselves, so TE infers no padding between sequences (pad_between_seqs False, its identity check) and
keeps its flash and fused backends. TE asks nothing more of the lengths at CP 1; sequence parallelism
asks T divisible by TP (cases.make_case). The fp32 reference computes attention per segment
(worker.packed.SegmentAttention in place of TE's core attention): TE's fp32 THD attention is unfused and
pads every segment to the longest. Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 (0.19.2):
models/gpt/gpt_model.py (forward -> decoder(packed_seq_params=...)), transformer/attention.py (thd:
squeeze(1), core attention, reshape to [t, 1, h]), extensions/transformer_engine.py (TEDotProductAttention:
padding_causal for thd); TE 2.19+ dot_product_attention.py (pad_between_seqs inferred by identity).
"""
from __future__ import annotations

import contextlib

import torch

from tptune.cases import Case
from tptune.measure.worker import numerics
from tptune.measure.worker.context import TORCH_DTYPES, RankContext
from tptune.measure.worker.packed import SegmentAttention, packed_input, packed_model
from tptune.measure.worker.te_common import (AMAX_COMPUTE_ALGO, AMAX_HISTORY_LEN, LAYERNORM_EPS, LocalCollectives,
                                             TeBench, bench_ub_cfgs, case_environment, finite_result,
                                             prime_reference)
from tptune.model.spec import FP8_RECIPES, ModelConfig
from tptune.te.megatron_flags import block_switches, check_switches

DEFAULT_LAYERS = 2
# The references of the numerics check, kept for the next setting of the same block (one entry): the
# same-precision no-overlap block's errors and the higher-precision block's tensors (on the host).
_REFERENCES: dict = {}


def _seed_rng(seed: int) -> None:
    """Megatron's model-parallel RNG tracker (TE attention forks it; weight init draws from it), reset
    before every build so that every setting of a session builds the same weights."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    model_parallel_cuda_manual_seed(seed)


class TeBlockBench(TeBench):
    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, seed: int = 1234):
        if case.variant.kind not in ("none", "nocomm", "ub"):
            raise ValueError(f"{case.id}: a layer case is none, nocomm or ub.<preset> on the te backend")
        self._require_cuda(case, ctx)
        if ctx.world_size != case.tp:
            raise ValueError(f"{case.id}: needs a worker group of {case.tp} ranks, got {ctx.world_size}")
        self.pack = packed_input(case, settings)
        mc = packed_model(mc, self.pack)   # packed: seq_length T, micro-batch 1 (userbuffers for T tokens)
        w = mc.workload
        if w.seq_length % case.tp:
            raise ValueError(f"{case.id}: seq_length={w.seq_length} is not divisible by tp={case.tp}")
        self.case, self.mc, self.ctx, self.tp, self.seed = case, mc, ctx, case.tp, seed
        self.te_settings = dict(settings.get("te") or {})
        self.layers = int((settings.get("layer") or {}).get("num_layers", DEFAULT_LAYERS))
        self.dtype = TORCH_DTYPES[w.dtype]
        self.fp8 = w.is_fp8
        self.overlap = case.variant.kind == "ub"
        # nocomm: the no-overlap block with its TP collectives as local copies while it runs, the block's
        # own no-communication bound (te_common.LocalCollectives, as the op benches' bound)
        self.local = LocalCollectives(ctx.rank, case.tp) if case.variant.kind == "nocomm" else None
        self.ub_cfgs, self.switches = None, None
        if self.overlap:
            self.ub_cfgs = bench_ub_cfgs(case, mc, self.te_settings)
            given = (self.te_settings.get("preset_switches") or {}).get(case.variant.preset)
            if given is not None:   # a pair as a user wrote it (tptune verify --pair), consistent or not
                check_switches(given)
                self.switches = dict(given)
            else:
                try:   # what the emitted transformer_config_overrides.yaml holds for this ub_cfgs
                    self.switches = block_switches(self.ub_cfgs)
                except ValueError as exc:
                    raise ValueError(f"{case.id}: Megatron's switches cannot build this block: {exc}") from None
        self._load_te(case, mc, ctx)
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
            with case_environment(case, self.te_settings):
                self.block = self._build(self.overlap)
            gen = torch.Generator(device=ctx.device).manual_seed(seed + 17 * ctx.rank)
            shape = (w.seq_length // self.tp, w.micro_batch_size, mc.model.hidden_size)
            self.x = torch.randn(shape, generator=gen, device=ctx.device, dtype=self.dtype).requires_grad_(True)
            self.grad_out = torch.randn(shape, generator=gen, device=ctx.device, dtype=self.dtype)
            self.out = None
            self.packed_seq_params = self._packed_seq_params()
        except BaseException:
            self._teardown(collective=False)
            raise

    def _packed_seq_params(self):
        """Megatron-core's PackedSeqParams of the packed input (None for one causal sequence a sample)."""
        if self.pack is None:
            return None
        from megatron.core.packed_seq_params import PackedSeqParams
        cu = torch.tensor(self.pack.cu_seqlens, dtype=torch.int32, device=self.ctx.device)
        # the padded offsets are the same tensors: the padding is a segment of its own, none lies between
        # sequences, and TE (2.19+) reads pad_between_seqs off their identity
        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                               cu_seqlens_kv_padded=cu, max_seqlen_q=self.pack.max_seqlen,
                               max_seqlen_kv=self.pack.max_seqlen)

    def _config(self, overlap: bool, reference_dtype: torch.dtype | None = None):
        """The block's TransformerConfig; ``reference_dtype``: the higher-precision no-overlap reference
        (no FP8, attention recomputed in backward so that its fp32 scores are not kept per layer)."""
        m = self.mc.model
        dtype = reference_dtype or self.dtype
        extra = ({"recompute_granularity": "selective"} if reference_dtype is not None else self._fp8_config())
        return self.TransformerConfig(
            num_layers=self.layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
            num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
            kv_channels=m.kv_channels, gated_linear_unit=m.gated_mlp,
            activation_func=torch.nn.functional.silu if m.gated_mlp else torch.nn.functional.gelu,
            add_bias_linear=False, bias_activation_fusion=False, normalization="RMSNorm",
            layernorm_epsilon=LAYERNORM_EPS, attention_dropout=0.0, hidden_dropout=0.0,
            tensor_model_parallel_size=self.tp, sequence_parallel=self.tp > 1,
            **(self.switches if overlap else {"tp_comm_overlap": False}),
            params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
            **extra, **self._moe_config())

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
        w = self.mc.workload
        if w.recipe == "nvfp4":
            return {"fp4": "e2m1", "fp4_recipe": "nvfp4"}
        return {"fp8": w.fp8_format, "fp8_recipe": FP8_RECIPES[w.recipe][1],
                "fp8_amax_history_len": AMAX_HISTORY_LEN, "fp8_amax_compute_algo": AMAX_COMPUTE_ALGO}

    def _build(self, overlap: bool, reference_dtype: torch.dtype | None = None):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = self._config(overlap, reference_dtype)
        if self.mc.model.is_moe:   # per-layer specs: dense and MoE layers as moe_layer_freq lays them out
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True)
        else:
            spec = get_gpt_layer_with_transformer_engine_spec()
        block = TransformerBlock(config, spec, post_layer_norm=False)
        if self.pack is not None and reference_dtype is not None:   # per-segment attention (module doc)
            for layer in block.layers:
                layer.self_attention.core_attention = SegmentAttention(self.pack.segments)
        return block.to(device=self.ctx.device)

    def _run(self, block, x, autocast: bool = True):
        packed = {} if self.pack is None else {"packed_seq_params": self.packed_seq_params}
        with self._autocast() if autocast else contextlib.nullcontext():
            out = block(hidden_states=x, attention_mask=None, **packed)
        return out[0] if isinstance(out, tuple) else out

    def forward(self):
        with self._collectives():
            self.out = self._run(self.block, self.x)
        return self.out

    def grad_params(self):
        return self.block.parameters()

    def tensors(self, block, *, dtype: torch.dtype | None = None, autocast: bool = True) -> dict:
        """One fwd+bwd of ``block`` on the bench's input and output gradient (cast to ``dtype``): its
        output, input gradient and every weight gradient by parameter name; the gradients cleared after."""
        x = self.x.detach().to(dtype or self.x.dtype).requires_grad_(True)
        out = self._run(block, x, autocast=autocast)
        out.backward(self.grad_out.to(dtype or self.grad_out.dtype))
        got = {"output": out.detach(), "input_grad": x.grad.detach()}
        for name, p in block.named_parameters():
            if p.grad is not None:
                got[name] = p.grad.detach()
                p.grad = None
        return got

    def correctness(self) -> dict:
        """Against the no-overlap block in fp32 (stats.numerics): output, input gradient and every weight
        gradient of this setting, and of the same-precision no-overlap block (the baseline; FP8: under
        the same recipe, primed as te_common.prime_reference does), both built afresh from this block's
        weights. The measured block is released first: the fp32 block needs about twice its memory. The
        references are kept for the session's next setting when the weights and data are the same."""
        self.zero_grad()
        if self.local is not None:   # the bound computes on copies of its own shards: finite is all it can be
            with self._collectives():
                test = self.tensors(self.block)
            return finite_result(test, self.ctx, "finite output and gradients (the bound: TP collectives as local copies)")
        test = self.tensors(self.block)
        state = {k: v for k, v in self.block.state_dict().items() if not k.endswith("_extra_state")}
        self.block = self.out = None
        torch.cuda.empty_cache()
        precision = "fp8" if self.fp8 else numerics.TORCH_PRECISION[self.dtype]
        hp_dtype = numerics.higher_dtype(precision)
        key = self._fingerprint(state)
        hit = torch.tensor([1.0 if key in _REFERENCES else 0.0], device=self.ctx.device)
        torch.distributed.all_reduce(hit, op=torch.distributed.ReduceOp.MIN, group=self.ctx.group)
        if hit.item() == 1.0:
            base, hp = _REFERENCES[key]
        else:
            _REFERENCES.clear()
            same = self._reference(state, None)
            hp = self._reference(state, hp_dtype)
            base = numerics.errors(same, hp, self.ctx.group, self.ctx.device)
            del same
            hp = {k: v.to("cpu") for k, v in hp.items()}
            _REFERENCES[key] = (base, hp)
        res = numerics.verdict(test, base, hp, self.ctx.group, self.ctx.device, precision,
                               reference=f"the same block with tp_comm_overlap=False in {numerics.HIGHER[precision]}")
        self.ctx.sync()
        return res

    def _reference(self, state: dict, dtype: torch.dtype | None) -> dict:
        """The no-overlap block's tensors, built with the measured weights: in the measured precision
        (``dtype`` None; FP8 primed) or in ``dtype`` (fp32: no FP8, no autocast)."""
        _seed_rng(self.seed)
        ref = self._build(False, dtype)
        missing, unexpected = ref.load_state_dict(state, strict=False)
        wrong = [k for k in missing if k in dict(ref.named_parameters())] + list(unexpected)
        if wrong:
            raise RuntimeError(f"reference block does not match the measured one: {wrong[:5]}")
        if dtype is None:
            prime_reference(self.mc, lambda x, m=ref: self._run(m, x), self.x, self.grad_out, ref.parameters())
        got = self.tensors(ref, dtype=dtype, autocast=dtype is None)
        del ref
        torch.cuda.empty_cache()
        return got

    def _fingerprint(self, state: dict) -> tuple:
        """What the references depend on: the block's shape, the workload, and its weights and data (sums)."""
        sums = [float(torch.linalg.vector_norm(t.detach(), dtype=torch.float32)) + float(t.sum(dtype=torch.float32))
                for t in (*state.values(), self.x, self.grad_out) if t.is_floating_point()]
        return (self.case.tp, self.layers, repr(self.mc.model), repr(self.mc.workload), self.pack, tuple(sums))

    def _teardown(self, collective: bool) -> None:
        self.out = self.block = None
        self.x = self.grad_out = None
        self.packed_seq_params = None
        self._release_ub(collective)

"""Memory per GPU of Megatron-core training at each candidate TP, and the smallest TP that fits.

The TP decision must never go below the smallest TP at which the model can be trained at all.
``tp_floor`` estimates, for every TP in the node, the memory of the most loaded GPU and returns that
floor; ``estimate`` gives one TP's terms. Every number is in bytes. What is counted, and why:

**Model state** (Megatron-core ``DistributedDataParallel`` + ``DistributedOptimizer``, Adam).
Bytes per parameter, from Megatron-core's distributed-optimizer guide
(https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html, the table of
"theoretical number of bytes per parameter", d = data-parallel size), split into its three parts:

    dtype  weights  main grads           optimizer (master copy, Adam m and v)  total: plain / distributed
    bf16   2        4 (fp32, Megatron's  12 (fp32 master + m + v)               18 / 6 + 12/d
                       default for bf16: accumulate_allreduce_grads_in_fp32)
    fp16   2        2                    16 (fp32 master + fp32 grad + m + v)   20 / 4 + 16/d
    fp32   4        4                    8  (m + v)                             16 / 8 + 8/d

The distributed optimizer shards only the optimizer column over dp; weights and the grad buffer stay
whole on every data-parallel rank. ``megatron/training/theoretical_memory_usage.py`` uses the same
18 / 6 + 12/d.

Parameters on one GPU (TP size t, PP size p): per layer, QKV h*(q+2kv)/t, proj q*h/t, fc1 h*f*g/t
(g = 2 for a gated MLP), fc2 f*h/t, and two RMSNorm weights 2h (replicated; biases such as Qwen's
QKV bias, <0.002% of the parameters, are not counted). The word embedding, V*h/t with V padded to a
multiple of 128*t (Megatron's make_vocab_size_divisible_by=128), sits on the first stage; the output
layer (its own V*h/t when untied; with PP > 1 the last stage holds a copy even when tied) and the
final norm on the last stage. With PP = 1 and tied embeddings the one matrix serves both.

**Activations** kept for the backward pass, per layer and micro-batch of b sequences of s tokens,
with sequence parallelism (TE userbuffers overlap requires it, so every term is divided by t) and
fused/flash attention (no s*s score matrix). Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (arXiv:2205.05198), section 4.1, count sbh*(34 + 5as/h)
bytes for a GPT layer (4h MLP, multi-head attention, 2-byte activations, dropout); the same terms
for the real shapes (q = heads*kv_channels, kv = query groups*kv_channels, f = ffn_hidden_size),
with P bytes per activation element (2 for bf16/fp16, 4 for fp32), per token:

    norm_inputs       2P*h       inputs of the two norms (attention and MLP), for their backward
    qkv_input         P*h        norm output saved by the QKV GEMM for wgrad (the SP shard; it is
                                 all-gathered again in the backward pass)
    qkv               P*(q+2kv)  Q, K, V, saved by core attention
    attention_output  P*q        core attention's output, saved by proj (and by flash attention)
    fc1_input         P*h        second norm's output saved by fc1
    fc1_output        P*g*f      the activation function's input (gate and up halves when gated)
    fc2_input         P*f        the activation function's output, saved by fc2
    softmax_stats     4*heads    flash attention's fp32 log-sum-exp (core attention)
    [unfused attention: attention_scores P*heads*s (softmax output; with dropout also its 1-byte
     mask and the dropped-out copy: (2P+1)*heads*s) in place of softmax_stats]
    [dropout on: dropout_masks 2*h, the 1-byte masks of the two residual dropouts]

For Korthikanti's shapes (q = kv = h, f = 4h, not gated, dropout, P = 2) these add up to 34*h per
token plus 5*heads*s: their formula exactly (tests/model/test_memory.py checks it, and Megatron-LM's
megatron/training/theoretical_memory_usage.py, sbh(18 + 4f/h)/t). Llama/Qwen train without dropout
(Megatron-Bridge's LlamaModelProvider sets attention_dropout = hidden_dropout = 0), the default here.
Norm statistics (8 bytes per token) and the token ids are left out.

``recompute`` (Megatron-core's recompute_granularity): ``none`` keeps all of the above;
``selective`` recomputes core attention (Megatron-core's default recompute_modules=["core_attn"]):
it drops softmax_stats/attention_scores, so with flash attention it saves almost nothing (Q, K, V
and the output are kept by the neighbouring GEMMs anyway); ``full`` recomputes each whole layer
(recompute_method uniform, one layer per checkpoint): each layer keeps only its input, P*h per token,
and the layer being recomputed needs its full set once.

Pipeline parallelism follows Megatron's convention (``theoretical_memory_usage.py``): layers are
split evenly over the p stages; under the 1F1B schedule stage k holds p-k micro-batches in flight
(assuming at least p micro-batches per step), so the first stage holds p micro-batches of its L/p
layers, as many activations as the whole model without PP. The stage holding the output layer adds
its inputs and the fp32 logits of the cross-entropy loss: (2P*h + 4*V)/t per token (Megatron:
4sbh(1 + V/h)/t for P = 2). Each stage is estimated; the most loaded one is the GPU that must fit.

**What fits**: the estimate must stay within ``memory_fraction`` (default 0.9) of the GPU's memory;
the rest is headroom for what is not modelled: the CUDA context, NCCL and userbuffers buffers,
allocator fragmentation, the transient working set of the layer being computed.

**MoE models** (docs/models.md, "Memory"): each layer is counted by its kind. A dense layer has the
dense MLP. An MoE layer has the router (replicated), the shared experts (over TP) and the routed
experts, which are split over ``parallel.ep`` x ``parallel.etp`` (expert TP, default = TP as in
Megatron). The distributed optimizer shards the routed experts over dp*tp/(ep*etp). MTP blocks sit
on the last stage. MoE-layer activations assume drop-less top-k routing (``layer_activations``,
kind "moe").

Settings (run config; every key optional, defaults in ``PARALLEL_DEFAULTS``):
``parallel: {dp, pp, distributed_optimizer, recompute, memory_fraction, memory_check, ep, etp}``:
``dp: auto`` is the node's GPUs left over by TP x PP (gpus_per_node // (tp*pp), at least 1), i.e. a
one-node job; a multi-node job shards the optimizer wider: set ``dp``. ``hardware.gpu_memory_gb``
(GiB, as torch reports it: 139.8 for an H200 "141 GB", 79.1 for an H100 80GB) overrides the device's
own figure (``gpu_memory_bytes`` gives the order). ``decision.min_tp`` overrides the floor.
``parallel.memory_check: false`` turns the check off (floor = min_tp or 1). A model file without
``num_layers`` or ``vocab_size`` stops the check with a message naming the field, unless min_tp is
set or the check is off.
"""
from __future__ import annotations

import math
import os
from typing import Any

from tptune.errors import ConfigError
from tptune.model.ops import attention_linears
from tptune.model.spec import ModelConfig, ModelSpec

GIB = 2**30
MAX_PP = 1024                     # the deepest pipeline the smallest layout is searched to (the schema's too)
VOCAB_DIVISIBLE_BY = 128          # Megatron's make_vocab_size_divisible_by default
RECOMPUTE = ("none", "selective", "full")
PARALLEL_DEFAULTS: dict[str, Any] = {
    "dp": "auto",                 # data-parallel size the distributed optimizer shards over
    "pp": 1,                      # pipeline-parallel size
    "distributed_optimizer": True,
    "recompute": "none",          # none | selective | full
    "memory_fraction": 0.9,       # share of the GPU's memory the estimate may fill
    "memory_check": True,
    "ep": 1,                      # expert-parallel size (Megatron's expert_model_parallel_size)
    "etp": None,                  # expert tensor-parallel size; None: = TP (Megatron's default)
}
# Bytes per parameter (weights, main grads, optimizer), Megatron-core's distributed-optimizer guide.
STATE_BYTES = {"bf16": (2, 4, 12), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}
FIELD_HINTS = {
    "num_layers": "'num_layers' (Hugging Face config.json: 'num_hidden_layers')",
    "vocab_size": "'vocab_size'",
}


# --- settings ----------------------------------------------------------------------------------

def parallel_problems(parallel: dict | None) -> list[str]:
    """What is wrong with a run config's ``parallel`` section (empty if nothing)."""
    par = parallel or {}
    if not isinstance(par, dict):
        return [f"field 'parallel': expected a mapping, got {type(par).__name__}"]
    out = []
    unknown = set(par) - set(PARALLEL_DEFAULTS)
    if unknown:
        out.append(f"field 'parallel': unknown key(s) {sorted(unknown)} (expected {', '.join(PARALLEL_DEFAULTS)})")
    dp = par.get("dp", "auto")
    if dp != "auto" and not _pos_int(dp):
        out.append(f"field 'parallel.dp' = {dp!r}: expected 'auto' or a positive integer")
    if not _pos_int(par.get("pp", 1)):
        out.append(f"field 'parallel.pp' = {par.get('pp')!r}: expected a positive integer")
    for key in ("distributed_optimizer", "memory_check"):
        if not isinstance(par.get(key, True), bool):
            out.append(f"field 'parallel.{key}' = {par.get(key)!r}: expected true or false")
    if par.get("recompute", "none") not in RECOMPUTE:
        out.append(f"field 'parallel.recompute' = {par.get('recompute')!r}: expected one of {', '.join(RECOMPUTE)}")
    if not _pos_int(par.get("ep", 1)):
        out.append(f"field 'parallel.ep' = {par.get('ep')!r}: expected a positive integer (expert-parallel size)")
    if par.get("etp") is not None and not _pos_int(par.get("etp")):
        out.append(f"field 'parallel.etp' = {par.get('etp')!r}: expected a positive integer (expert tensor-parallel "
                   "size) or null (= TP)")
    frac = par.get("memory_fraction", 0.9)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        out.append(f"field 'parallel.memory_fraction' = {frac!r}: expected a number in (0, 1]")
    return out


def parallel_settings(parallel: dict | None) -> dict:
    """``parallel`` with defaults filled in; raises ConfigError naming every bad field."""
    problems = parallel_problems(parallel)
    if problems:
        raise ConfigError("parallel", problems)
    return {**PARALLEL_DEFAULTS, **(parallel or {})}


def config_problems(config: dict, model_config: ModelConfig | None = None) -> list[str]:
    """Problems of a merged run config's memory settings, for settings.resolve to report early:
    the ``parallel`` section, ``decision.min_tp``, ``hardware.gpu_memory_gb``, and (when the
    check will run) model fields the check needs and a PP that does not divide the layer count."""
    out = parallel_problems(config.get("parallel"))
    min_tp = (config.get("decision") or {}).get("min_tp")
    if min_tp is not None and not _pos_int(min_tp):
        out.append(f"field 'decision.min_tp' = {min_tp!r}: expected a positive integer")
    gb = (config.get("hardware") or {}).get("gpu_memory_gb")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, (int, float)) or gb <= 0):
        out.append(f"field 'hardware.gpu_memory_gb' = {gb!r}: expected a positive number (GiB)")
    if out or model_config is None:
        return out
    par = parallel_settings(config.get("parallel"))
    if par["memory_check"] and min_tp is None:
        out += missing_field_problems(model_config)
    layers = model_config.model.num_layers
    if layers and layers % par["pp"]:
        out.append(f"field 'parallel.pp' = {par['pp']}: does not divide the model's num_layers={layers}")
    return out + expert_layout_problems(model_config.model, par, config.get("gpus_per_node", 8))


def expert_layout_problems(m: ModelSpec, par: dict, gpus_per_node: int = 8) -> list[str]:
    """What is wrong with ``parallel.ep``/``parallel.etp`` for this model, whatever the TP: EP on a
    dense model, an EP that does not divide the expert count, an EP x ETP group larger than the GPUs
    of one pipeline stage (Megatron requires dp*tp to be a multiple of ep*etp). The per-TP check
    (dp*tp divisible by ep*etp) is made for each TP by ``estimate``."""
    ep, etp = par.get("ep", 1), par.get("etp")
    out = []
    if not m.is_moe:
        if ep != 1:
            out.append(f"field 'parallel.ep' = {ep}: the model has no experts (expert parallelism needs an MoE model)")
        if etp is not None:
            out.append(f"field 'parallel.etp' = {etp}: the model has no experts (expert tensor parallelism needs "
                       "an MoE model)")
        return out
    if m.num_moe_experts % ep:
        out.append(f"field 'parallel.ep' = {ep}: does not divide the model's {m.num_moe_experts} routed experts "
                   "(num_moe_experts)")
    dp = par.get("dp", "auto")
    # GPUs of one pipeline stage, dp*tp: a one-node job ('auto') has gpus_per_node // pp of them
    stage_gpus = gpus_per_node // par.get("pp", 1) if dp == "auto" else dp * gpus_per_node
    if ep * (etp or 1) > stage_gpus:
        out.append(f"field 'parallel.ep' = {ep}: ep x etp = {ep * (etp or 1)} GPUs exceeds the {stage_gpus} GPUs of "
                   f"one pipeline stage (dp x tp{', one node' if dp == 'auto' else ''}); Megatron requires dp*tp to "
                   "be a multiple of ep*etp")
    return out


def missing_fields(model_config: ModelConfig) -> list[str]:
    """Model fields the memory check needs and the model file did not give."""
    m = model_config.model
    return [name for name in FIELD_HINTS if getattr(m, name) is None]


def missing_field_problems(model_config: ModelConfig) -> list[str]:
    return [f"model file {model_config.source}: field {FIELD_HINTS[name]} is missing: the memory check needs "
            f"it to count the model's weights and activations per GPU. Add it to the model file, or set "
            f"decision.min_tp (the smallest TP to consider), or parallel.memory_check: false"
            for name in missing_fields(model_config)]


def gpu_memory_bytes(hardware: dict | None = None, device: str = "cuda", *, recorded_gib: float | None = None,
                     ranks_per_host: int = 1) -> int | None:
    """The memory of one GPU, from the first source that has it: ``hardware.gpu_memory_gb`` (GiB),
    the figure recorded by a run's environment (``gpu_memory_gib`` in run.json, for re-deriving a GPU
    run's decisions elsewhere), the CUDA device (torch.cuda.get_device_properties(0).total_memory).
    A CPU run (device "cpu") stands a share of the host's memory in for a GPU's: physical memory
    divided by ``ranks_per_host``. None when nothing is known (a "cuda" run without a visible GPU)."""
    gb = (hardware or {}).get("gpu_memory_gb")
    if gb:
        return int(gb * GIB)
    if recorded_gib:
        return int(recorded_gib * GIB)
    if device == "cuda":
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.get_device_properties(0).total_memory)
        except Exception:  # noqa: BLE001 - no usable torch/CUDA: unknown
            return None
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, ranks_per_host)
    except (ValueError, OSError, AttributeError):
        return None


# --- the estimate ------------------------------------------------------------------------------

def padded_vocab(vocab: int, tp: int) -> int:
    """Vocabulary padded as Megatron pads it: to a multiple of make_vocab_size_divisible_by * TP."""
    step = VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // step) * step


def attention_params(m: ModelSpec, tp: int) -> dict[str, int]:
    """Attention weights of one layer on one GPU at TP ``tp``. Multi-head/GQA: QKV h*(q+2kv)/t, proj
    q*h/t. MLA (Megatron-core's MLASelfAttention): the down projections linear_q_down_proj h*rq and
    linear_kv_down_proj h*(rkv+dr) are not split over TP (duplicated), nor their norms rq + rkv; the up
    projections linear_q_up_proj rq*heads*(dn+dr) (or one linear_q_proj h*heads*(dn+dr) without a q
    LoRA rank) and linear_kv_up_proj rkv*heads*(dn+dv) and linear_proj heads*dv*h are split."""
    out = {}
    for x in attention_linears(m):   # the shapes ops.layer_linears reports
        name = x.module.removeprefix("self_attention.")
        out[_ATTENTION_PARTS[name]] = x.k_in * x.n_out // (1 if name.endswith("_down_proj") else tp)
    if m.is_mla:
        out["latent_norms"] = (m.q_lora_rank or 0) + m.kv_lora_rank
    return out


# attention_linears' modules -> attention_params' keys
_ATTENTION_PARTS = {"linear_qkv": "qkv", "linear_proj": "proj", "linear_q_down_proj": "q_down",
                    "linear_q_up_proj": "q_up", "linear_q_proj": "q_proj", "linear_kv_down_proj": "kv_down",
                    "linear_kv_up_proj": "kv_up"}


def mlp_params(m: ModelSpec, width: int, tp: int) -> int:
    """One MLP of ``width``: fc1 h*width*g (g = 2 gated) and fc2 width*h, split over ``tp``."""
    return m.hidden_size * width * ((2 if m.gated_mlp else 1) + 1) // tp


def layer_params(m: ModelSpec, tp: int, kind: str = "dense", ep: int = 1, etp: int | None = None) -> dict[str, int]:
    """Parameters of one transformer layer on one GPU at TP ``tp``. ``kind`` "dense": attention, the
    dense MLP (fc1, fc2), two norms. "moe": attention, the router [experts x h] (replicated over TP, as
    Megatron's TopKRouter keeps it), the shared experts (fc1/fc2 of the shared width, split over TP like
    a dense MLP) and ``routed_experts``: experts x MLP of the routed width, split over EP x ETP (``etp``
    None: = TP)."""
    g = 2 if m.gated_mlp else 1
    out = attention_params(m, tp)
    if kind == "dense":
        out["fc1"] = m.hidden_size * m.ffn_hidden_size * g // tp
        out["fc2"] = m.ffn_hidden_size * m.hidden_size // tp
    elif kind == "moe":
        out["router"] = m.num_moe_experts * m.hidden_size
        if m.moe_shared_expert_intermediate_size:
            out["shared_experts"] = mlp_params(m, m.moe_shared_expert_intermediate_size, tp)
        out["routed_experts"] = (m.num_moe_experts // ep) * mlp_params(m, m.moe_ffn_hidden_size, etp or tp)
    else:
        raise ValueError(f"kind={kind!r}: expected dense or moe")
    out["norms"] = 2 * m.hidden_size               # RMSNorm weights, replicated over TP
    return out


def mtp_params(m: ModelSpec, tp: int, ep: int = 1, etp: int | None = None) -> dict[str, int]:
    """One multi-token-prediction block (Megatron-core's MultiTokenPredictionLayer, DeepSeek-V3's nextn
    layer): enorm + hnorm + its final norm (3h), eh_proj [2h -> h] (column-parallel), and one transformer
    layer of the model's last-layer kind (MoE for DeepSeek-V3). It shares the embedding and the output
    layer with the main model (a Hugging Face checkpoint stores its own copies of both)."""
    n = m.layer_count
    kind = "moe" if n and m.moe_layers_in(n - 1, n) else "dense"
    layer = layer_params(m, tp, kind, ep, etp)
    return {"eh_proj": 2 * m.hidden_size * m.hidden_size // tp, "mtp_norms": 3 * m.hidden_size,
            **{f"layer_{k}": v for k, v in layer.items()}}


def model_params(m: ModelSpec) -> dict[str, Any]:
    """The whole model's parameter count by part (unsharded, unpadded vocabulary), ``total`` and
    ``active`` (the parameters one token goes through: the top-k of the routed experts, everything
    else whole, both embedding matrices counted), ``active_without_embedding`` (the input embedding,
    a lookup, left out: OpenAI's convention for GPT-OSS), and ``mtp`` (the MTP blocks, not in total)."""
    layers = m.layer_count or 0
    moe = m.moe_layers_in(0, layers)
    h, v = m.hidden_size, m.vocab_size
    parts = {"embedding": v * h, "output_layer": v * h if m.untie_embeddings_and_output_weights else 0,
             "final_norm": h, "attention": 0, "norms": 0, "dense_mlp": 0, "router": 0, "shared_experts": 0,
             "routed_experts": 0}
    attention = sum(attention_params(m, 1).values())
    for kind, n in (("moe", moe), ("dense", layers - moe)):
        if not n:
            continue
        lp = layer_params(m, 1, kind)
        parts["attention"] += n * attention
        parts["norms"] += n * lp["norms"]
        parts["dense_mlp"] += n * (lp.get("fc1", 0) + lp.get("fc2", 0))
        for k in ("router", "shared_experts", "routed_experts"):
            parts[k] += n * lp.get(k, 0)
    total = sum(parts.values())
    active = total - parts["routed_experts"]
    if m.is_moe:
        active += parts["routed_experts"] * m.moe_router_topk // m.num_moe_experts
    mtp = (m.mtp_num_layers or 0) * sum(mtp_params(m, 1).values())
    return {**parts, "total": total, "active": active, "active_without_embedding": active - parts["embedding"],
            "mtp": mtp}


def layer_activations(m: ModelSpec, seq_length: int, micro_batch_size: int, tp: int, dtype_bytes: int = 2, *,
                      recompute: str = "none", sequence_parallel: bool = True, flash: bool = True,
                      dropout: bool = False, kind: str = "dense", etp: int | None = None) -> dict[str, int]:
    """Bytes one transformer layer keeps for its backward pass, per micro-batch, on one GPU (terms
    in the module doc, ``total`` their sum). ``sequence_parallel=False`` keeps the norm-side terms
    whole on every TP rank (Korthikanti's 10 + 24/t); ``flash=False`` stores the attention scores.
    ``kind="moe"``: the MLP terms are the MoE layer's (module doc, drop-less routing), ``etp`` the
    expert tensor-parallel size (None: = TP)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: expected one of {', '.join(RECOMPUTE)}")
    p, h, a = dtype_bytes, m.hidden_size, m.num_attention_heads
    tokens = seq_length * micro_batch_size
    sp = tp if sequence_parallel else 1
    g = 2 if m.gated_mlp else 1

    def per(n_per_token: int, div: int) -> int:
        return -(-n_per_token * tokens // div)

    terms = {
        "norm_inputs": per(2 * p * h, sp),
        "qkv_input": per(p * h, sp),
        "qkv": per(p * m.qkv_out, tp),
        "attention_output": per(p * m.q_size, tp),
        "fc1_input": per(p * h, sp),
    }
    if kind == "dense":
        terms["fc1_output"] = per(p * g * m.ffn_hidden_size, tp)
        terms["fc2_input"] = per(p * m.ffn_hidden_size, tp)
    else:   # drop-less routing: every token goes through k routed experts
        k, fe, e = m.moe_router_topk, m.moe_ffn_hidden_size, etp or tp
        terms["router_probs"] = per(8 * m.num_moe_experts, sp)
        terms["expert_input"] = per(p * h * k * e, tp)
        terms["expert_fc1_output"] = per(p * g * fe * k, tp)
        terms["expert_fc2_input"] = per(p * fe * k, tp)
        terms["expert_output"] = per(p * h * k * e, tp)
        if m.moe_shared_expert_intermediate_size:
            fs = m.moe_shared_expert_intermediate_size
            terms["shared_fc1_output"] = per(p * g * fs, tp)
            terms["shared_fc2_input"] = per(p * fs, tp)
    if dropout:
        terms["dropout_masks"] = per(2 * h, sp)
    if recompute == "none":
        if flash:
            terms["softmax_stats"] = per(4 * a, tp)
        else:
            terms["attention_scores"] = per(((2 * p + 1) if dropout else p) * a * seq_length, tp)
    if recompute == "full":       # each layer keeps its input only; the full set is counted once per stage
        terms = {"layer_input": per(p * h, sp)}
    terms["total"] = sum(terms.values())
    return terms


def estimate(model_config: ModelConfig, tp: int, parallel: dict | None = None, gpu_memory_bytes: int | None = None,
             *, gpus_per_node: int = 8) -> dict:
    """Memory of the most loaded GPU when training ``model_config`` at TP ``tp`` under ``parallel``.

    Returns a JSON-serialisable dict: ``tp, pp, dp, distributed_optimizer, recompute``; the terms in
    bytes ``weights, main_grads, optimizer, activations, output_activations`` and their ``total``
    (the most loaded pipeline stage, named by ``stage``; ``stages`` lists every stage's total);
    ``params`` on that GPU; ``gpu_memory`` and ``usable`` (bytes, None if unknown); ``fits`` (None if
    the GPU's memory is unknown); ``problems`` (TP/PP that cannot run this model); ``why``.
    Raises ConfigError when the model file lacks a field the estimate needs."""
    par = parallel_settings(parallel)
    if missing_fields(model_config):
        raise ConfigError(model_config.source, missing_field_problems(model_config))
    m, w = model_config.model, model_config.workload
    pp = par["pp"]
    dp = max(1, gpus_per_node // (tp * pp)) if par["dp"] == "auto" else par["dp"]
    w_b, g_b, o_b = STATE_BYTES[w.params_dtype]  # FP8 training keeps bf16 params (Megatron)
    opt_b = o_b / dp if par["distributed_optimizer"] else o_b
    problems = model_config.tp_problems(tp)
    if m.num_layers % pp:
        problems.append(f"PP={pp} does not divide num_layers={m.num_layers}")
    ep, etp = par["ep"], par["etp"] or tp
    edp = max(1, dp * tp // (ep * etp))      # expert data-parallel size: the expert optimizer's shards
    if m.is_moe and (dp * tp) % (ep * etp):
        problems.append(f"parallel.ep={ep} x expert TP={etp} ({ep * etp} GPUs) does not divide dp x tp = "
                        f"{dp} x {tp} (Megatron's expert data-parallel size dp*tp/(ep*etp) must be whole)")
    if m.is_moe and m.num_moe_experts % ep:
        problems.append(f"parallel.ep={ep} does not divide the {m.num_moe_experts} routed experts")
    eopt_b = o_b / edp if par["distributed_optimizer"] else o_b
    layers_per_stage = -(-m.num_layers // pp)
    lp = {kd: layer_params(m, tp, kd, ep, etp) for kd in (("dense", "moe") if m.is_moe else ("dense",))}
    embedding = padded_vocab(m.vocab_size, tp) * m.hidden_size // tp
    untied = bool(m.untie_embeddings_and_output_weights)
    act_kw = dict(seq_length=w.seq_length, micro_batch_size=w.micro_batch_size, tp=tp, dtype_bytes=w.dtype_bytes,
                  etp=etp)
    act = {kd: layer_activations(m, recompute=par["recompute"], kind=kd, **act_kw) for kd in lp}
    whole = {kd: layer_activations(m, kind=kd, **act_kw)["total"] for kd in lp}
    out_act = -(-(2 * w.dtype_bytes * m.hidden_size + 4 * padded_vocab(m.vocab_size, tp)) * w.tokens // tp)
    mtp_n = m.mtp_num_layers or 0
    mtp = mtp_params(m, tp, ep, etp) if mtp_n else {}
    mtp_kind = "moe" if mtp.get("layer_routed_experts") is not None else "dense"

    stages = []
    for k in range(pp):
        first, last = k == 0, k == pp - 1
        start, stop = k * layers_per_stage, min((k + 1) * layers_per_stage, m.num_layers)
        moe = m.moe_layers_in(start, stop)
        n = {"moe": moe, "dense": max(0, stop - start) - moe}
        expert = n["moe"] * lp.get("moe", {}).get("routed_experts", 0)
        params = sum(n[kd] * sum(lp[kd].values()) for kd in lp)
        params += embedding if first else 0
        params += (m.hidden_size + (embedding if (untied or pp > 1) else 0)) if last else 0
        if last and mtp_n:                      # MTP blocks sit on the last stage (Megatron)
            params += mtp_n * sum(mtp.values())
            expert += mtp_n * mtp.get("layer_routed_experts", 0)
        in_flight = pp - k                      # 1F1B: stage k holds pp-k micro-batches
        layer_act = sum(n[kd] * act[kd]["total"] for kd in lp)
        mtp_act = mtp_n * (act[mtp_kind]["total"] + out_act) if last else 0
        full_set = max((whole[kd] for kd in lp if n[kd]), default=0) if par["recompute"] == "full" else 0
        terms = {
            "weights": params * w_b,
            "main_grads": params * g_b,
            "optimizer": math.ceil((params - expert) * opt_b + expert * eopt_b),
            "activations": in_flight * (layer_act + mtp_act) + full_set,
            "output_activations": out_act if last else 0,
        }
        stages.append({"stage": k, "params": params, "expert_params": expert,
                       "expert_state": math.ceil(expert * (w_b + g_b + eopt_b)),
                       "moe_layers": n["moe"], **terms, "total": sum(terms.values())})
    worst = max(stages, key=lambda s: s["total"])

    usable = int(gpu_memory_bytes * par["memory_fraction"]) if gpu_memory_bytes else None
    fits = None if usable is None else (worst["total"] <= usable and not problems)
    result = {
        "tp": tp, "pp": pp, "dp": dp, "distributed_optimizer": par["distributed_optimizer"],
        "recompute": par["recompute"],
        "stage": "only" if pp == 1 else ("first" if worst["stage"] == 0 else
                                         "last" if worst["stage"] == pp - 1 else f"stage {worst['stage']}"),
        "params": worst["params"], "expert_params": worst["expert_params"], "expert_state": worst["expert_state"],
        "ep": ep if m.is_moe else None, "etp": etp if m.is_moe else None, "edp": edp if m.is_moe else None,
        **{k: worst[k] for k in ("weights", "main_grads", "optimizer", "activations", "output_activations", "total")},
        "bytes_per_param": w_b + g_b + opt_b,
        "layer_activations": act["dense"]["total"],
        "moe_layer_activations": act["moe"]["total"] if "moe" in act else None,
        "stages": [{"stage": s["stage"], "total": s["total"]} for s in stages] if pp > 1 else [],
        "gpu_memory": gpu_memory_bytes, "usable": usable, "memory_fraction": par["memory_fraction"],
        "fits": fits, "problems": problems,
        "tied_embeddings_assumed": m.untie_embeddings_and_output_weights is None,
    }
    result["why"] = _why(result)
    return result


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _why(r: dict) -> str:
    where = f"TP={r['tp']}" + (f" x PP={r['pp']} ({r['stage']} stage)" if r["pp"] > 1 else "")
    if r["problems"]:
        return f"{where}: cannot run this model: " + "; ".join(r["problems"])
    state = r["weights"] + r["main_grads"] + r["optimizer"]
    parts = (f"weights+grads+optimizer {_gib(state)} ({r['bytes_per_param']:.2f} B/param x "
             f"{r['params'] / 1e9:.2f}B params, dp={r['dp']}"
             f"{', distributed optimizer' if r['distributed_optimizer'] else ''})"
             + (f" of which routed experts {_gib(r['expert_state'])} ({r['expert_params'] / 1e9:.2f}B params, "
                f"ep={r['ep']} x etp={r['etp']}, expert dp={r['edp']})" if r.get("expert_params") else "") + ", "
             f"activations {_gib(r['activations'] + r['output_activations'])} (recompute {r['recompute']})")
    if r["usable"] is None:
        return f"{where}: needs {_gib(r['total'])}: {parts}; GPU memory unknown"
    cap = f"{_gib(r['usable'])} usable ({r['memory_fraction']:.0%} of {_gib(r['gpu_memory'])})"
    if r["fits"]:
        return f"{where}: fits: {_gib(r['total'])} <= {cap}"
    return f"{where}: does not fit: needs {_gib(r['total'])} > {cap}: {parts}"


# --- what a run can measure ---------------------------------------------------------------------

def layer_bytes(model_config: ModelConfig, tp: int, tokens: int | None = None) -> int:
    """The activations one transformer layer keeps for its backward pass on one GPU at TP ``tp`` (the
    larger of its dense and MoE layers), for the workload's micro-batch or for ``tokens`` tokens: what
    no training layout goes below (pipeline stages hold whole layers; full recompute still rebuilds one
    layer's activations at a time), and what the measured block and each op's session hold at least."""
    m, w = model_config.model, model_config.workload
    seq, mbs = (w.seq_length, w.micro_batch_size) if tokens is None else (tokens, 1)
    kinds = [k for k, n in (("dense", m.dense_layers), ("moe", m.moe_layers)) if n] or ["dense"]
    return max(layer_activations(m, seq, mbs, tp, w.dtype_bytes, sequence_parallel=w.sequence_parallel,
                                 kind=kind)["total"] for kind in kinds)


def workload_problems(model_config: ModelConfig, tps: list[int], memory_bytes: int | None, memory_fraction: float,
                      memory_source: str) -> list[str]:
    """The TP sizes of ``tps`` at which the workload cannot be measured at all: one transformer layer's
    activations (layer_bytes) alone exceed the usable memory of one GPU (``memory_bytes`` x
    ``memory_fraction``; on CPU a rank's share of the host's). Every member of every session there would
    fail allocating. Empty when the memory is unknown. One problem naming the workload's fields, what was
    asked, the TP sizes that fit and the most tokens a micro-batch that fits at the largest TP."""
    if not memory_bytes or not tps:
        return []
    w = model_config.workload
    usable = int(memory_bytes * memory_fraction)
    need = {tp: layer_bytes(model_config, tp) for tp in sorted(tps)}
    too_big = [tp for tp, b in need.items() if b > usable]
    if not too_big:
        return []
    top = max(tps)
    per_token = layer_bytes(model_config, top, tokens=1 << 20) / (1 << 20)
    most = int(usable // per_token) if per_token else 0
    fits = [tp for tp in need if tp not in too_big]
    asked = f"seq_length={w.seq_length:,} x micro_batch_size={w.micro_batch_size:,} ({w.tokens:,} tokens a micro-batch)"
    where = f"TP={too_big[0]}" if len(too_big) == 1 else f"TP sizes {', '.join(map(str, too_big))}"
    return [f"field 'workload': {asked} cannot be measured at {where}: one transformer layer's activations alone "
            f"need {_gib(need[too_big[-1]])} per GPU at TP={too_big[-1]}, above the {_gib(usable)} usable "
            f"({memory_fraction:.0%} of {_gib(memory_bytes)}, {memory_source}); no pipeline layout or recompute "
            "holds less than one layer. "
            + (f"TP {', '.join(map(str, fits))} fit{'s' if len(fits) == 1 else ''}: leave TP "
               f"{', '.join(map(str, too_big))} out of tp_sizes, or " if fits else "")
            + f"{'l' if fits else 'L'}ower seq_length x micro_batch_size to at most about {most:,} tokens (at TP={top}). "
            "(The run's memory section, tptune.model.memory; parallel.memory_check: false skips this check.)"]


# --- the floor ---------------------------------------------------------------------------------

def node_tps(tps, gpus_per_node: int) -> list[int]:
    """TP sizes the floor is searched over: powers of two up to the node, plus the run's own."""
    out, t = set(int(x) for x in tps), 1
    while t <= gpus_per_node:
        out.add(t)
        t *= 2
    return sorted(out)


def smallest_layout(model_config: ModelConfig, parallel: dict | None, gpu_memory_bytes: int,
                    gpus_per_node: int = 8) -> dict | None:
    """The smallest (TP, PP) layout that fits: fewest GPUs per model replica (TP x PP), then the
    smaller PP; TP over powers of two up to the node, PP over the divisors of the layer count, the
    other settings of ``parallel`` kept (dp 'auto' re-derived per layout), PP up to MAX_PP. None if none fits."""
    par = parallel_settings(parallel)
    layers = model_config.model.num_layers
    pps = [d for d in _divisors(layers) if d <= MAX_PP]
    cands = sorted(((tp, pp) for tp in node_tps([], gpus_per_node) for pp in pps), key=lambda x: (x[0] * x[1], x[1]))
    for tp, pp in cands:
        if model_config.tp_problems(tp):
            continue
        r = estimate(model_config, tp, {**par, "pp": pp}, gpu_memory_bytes, gpus_per_node=gpus_per_node)
        if r["fits"]:
            return {"tp": tp, "pp": pp, "dp": r["dp"], "gpus": tp * pp, "total": r["total"], "usable": r["usable"],
                    "why": r["why"]}
    return None


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, smallest first (by trial up to its square root: n may be huge)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def tp_floor(model_config: ModelConfig, tps, parallel: dict | None = None, gpu_memory_bytes: int | None = None,
             gpus_per_node: int = 8, min_tp: int | None = None) -> dict:
    """The smallest TP the decision may recommend, and the memory table behind it.

    Returns a JSON-serialisable dict:
    - ``floor_tp``: the smallest TP in the node (powers of two up to ``gpus_per_node``, plus ``tps``)
      that the model can run at and that fits; ``min_tp`` when given (the user's override); 1 when the
      check is off; None when no TP in the node fits (``status`` "no_fit");
    - ``status``: "fits" | "no_fit" | "override" (min_tp set) | "unchecked" (parallel.memory_check off);
    - ``why``: one sentence for the report;
    - ``table``: one ``estimate`` per TP (empty when unchecked, or when min_tp is set and the model
      file lacks what the estimate needs);
    - ``smallest_layout``: when nothing in the node fits, the smallest (TP, PP) layout that would
      (see ``smallest_layout``), else None;
    - ``floor_in_tps``: whether floor_tp is among the run's ``tps``;
    - ``parallel``, ``gpu_memory``, ``gpus_per_node``, ``min_tp``: what it was computed with.
    Raises ConfigError when the check must run (memory_check on, no min_tp) and cannot: a model
    field it needs is missing, or the GPU's memory is unknown."""
    par = parallel_settings(parallel)
    if min_tp is not None and not _pos_int(min_tp):
        raise ConfigError("decision", [f"field 'decision.min_tp' = {min_tp!r}: expected a positive integer"])
    res: dict[str, Any] = {"floor_tp": None, "status": None, "why": "", "table": [], "smallest_layout": None,
                           "floor_in_tps": False, "parallel": par, "gpu_memory": gpu_memory_bytes,
                           "gpus_per_node": gpus_per_node, "min_tp": min_tp}
    if not par["memory_check"]:
        res.update(floor_tp=min_tp or 1, status="unchecked",
                   why="memory check off (parallel.memory_check: false)"
                       + (f"; decision.min_tp = {min_tp}" if min_tp else ": no TP floor"))
        return _done(res, tps)
    can_check = not missing_fields(model_config) and gpu_memory_bytes
    if min_tp is None and not can_check:
        if missing_fields(model_config):
            raise ConfigError(model_config.source, missing_field_problems(model_config))
        raise ConfigError("hardware", [
            "field 'hardware.gpu_memory_gb': the GPU's memory is unknown (no CUDA device to ask, none recorded): "
            "set it in GiB (e.g. 139.8 for an H200, 79.1 for an H100 80GB), or set decision.min_tp, or "
            "parallel.memory_check: false"])
    if can_check:
        res["table"] = [estimate(model_config, tp, par, gpu_memory_bytes, gpus_per_node=gpus_per_node)
                        for tp in node_tps(tps, gpus_per_node)]
    fitting = [r["tp"] for r in res["table"] if r["fits"] and r["tp"] <= gpus_per_node]
    est_floor = fitting[0] if fitting else None
    if min_tp is not None:
        res.update(floor_tp=min_tp, status="override")
        if not can_check:
            res["why"] = (f"decision.min_tp = {min_tp} (memory not estimated: "
                          + ("model file lacks " + ", ".join(FIELD_HINTS[f] for f in missing_fields(model_config))
                             if missing_fields(model_config) else "GPU memory unknown") + ")")
        else:
            res["why"] = (f"decision.min_tp = {min_tp} overrides the memory estimate, whose floor is "
                          + (f"TP={est_floor}" if est_floor else f"beyond the node (no TP up to {gpus_per_node} fits)")
                          + ("" if est_floor is None or min_tp >= est_floor
                             else f"; the estimate says TP={min_tp} does not fit"))
        return _done(res, tps)
    if est_floor is not None:
        below = [r for r in res["table"] if r["tp"] < est_floor]
        res.update(floor_tp=est_floor, status="fits",
                   why=(f"TP={est_floor} is the smallest TP that fits"
                        + (": " + "; ".join(r["why"] for r in below) if below else "")))
        return _done(res, tps)
    layout = smallest_layout(model_config, par, gpu_memory_bytes, gpus_per_node)
    res.update(status="no_fit", smallest_layout=layout)
    pp_txt = f" with PP={par['pp']}" if par["pp"] > 1 else ""
    if layout:
        res["why"] = (f"no TP up to {gpus_per_node} fits{pp_txt}; the smallest layout that fits is "
                      f"TP={layout['tp']} x PP={layout['pp']} ({layout['gpus']} GPUs per model replica, "
                      f"dp={layout['dp']}, {_gib(layout['total'])} <= {_gib(layout['usable'])})")
    else:
        res["why"] = (f"no TP up to {gpus_per_node} fits{pp_txt}, and no TP x PP layout up to "
                      f"PP={min(model_config.model.num_layers, MAX_PP)} fits either (raise parallel.dp, use recompute, or "
                      "more memory)")
    return _done(res, tps)


def _done(res: dict, tps) -> dict:
    res["floor_in_tps"] = res["floor_tp"] in set(tps)
    return res


def markdown_table(floor: dict) -> str:
    """The memory table of a ``tp_floor`` result, as Markdown (GiB), with its verdict line."""
    lines = [f"Memory floor: **{'TP=' + str(floor['floor_tp']) if floor['floor_tp'] else 'none in the node'}** "
             f"({floor['status']}): {floor['why']}", ""]
    if floor["table"]:
        lines += ["| TP | PP | DP | params/GPU | weights | main grads | optimizer | activations | output+loss | total "
                  "| usable | fits |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|"]
        for r in floor["table"]:
            g = lambda k: f"{r[k] / GIB:.1f}"  # noqa: E731
            fit = "cannot run" if r["problems"] else {True: "yes", False: "no", None: "?"}[r["fits"]]
            pp = f"{r['pp']} ({r['stage']})" if r["pp"] > 1 else "1"
            lines.append(f"| {r['tp']} | {pp} | {r['dp']} | {r['params'] / 1e9:.2f}B | {g('weights')} | "
                         f"{g('main_grads')} | {g('optimizer')} | {g('activations')} | {g('output_activations')} | "
                         f"{g('total')} | {'?' if r['usable'] is None else g('usable')} | {fit} |")
        par = floor["parallel"]
        lines += ["", f"GiB per GPU (most loaded pipeline stage); recompute {par['recompute']}, distributed "
                      f"optimizer {'on' if par['distributed_optimizer'] else 'off'}, usable = "
                      f"{par['memory_fraction']:.0%} of the GPU's memory; see tptune.model.memory for each term."]
        moe = [r for r in floor["table"] if r.get("ep") is not None]
        if moe:
            lines.append("MoE layout assumed: routed-expert weights, grads and optimizer state split over parallel.ep x "
                         "expert TP (etp " + (f"= {par.get('etp')}" if par.get("etp") else "= TP, Megatron's default")
                         + f"; ep = {par.get('ep', 1)}), the distributed optimizer over the expert data-parallel group "
                         "dp*tp/(ep*etp); attention, dense MLP, shared experts and router over TP as dense layers; "
                         "activations for drop-less routing (every token through its top-k experts). Routed experts "
                         "per GPU (params, weights+grads+optimizer): "
                         + ", ".join(f"TP={r['tp']}: {r['expert_params'] / 1e9:.2f}B, {r['expert_state'] / GIB:.1f} GiB"
                                     for r in moe) + ".")
        if any(r["tied_embeddings_assumed"] for r in floor["table"]):
            lines.append("The model file does not say whether the output layer shares the embedding's weights: "
                         "assumed tied (Megatron's and transformers' default).")
    return "\n".join(lines)


def _pos_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0

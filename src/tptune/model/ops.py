"""The four TP linear ops of a GPT layer and the sharded GEMMs/collectives of each at a TP size.

Column-parallel (qkv, fc1): all-gather of the sequence-parallel input before fprop; in backward the
input is all-gathered again for wgrad (overlapped with dgrad: TE's *_dgrad bulk) and dgrad's output is
reduce-scattered (overlapped with wgrad: TE's *_wgrad bulk).
Row-parallel (proj, fc2): reduce-scatter after fprop; in backward the output gradient is all-gathered
before dgrad; wgrad has no collective of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from tptune.model.spec import ModelConfig, ModelSpec

OPS = ("qkv", "proj", "fc1", "fc2")
LAYER = "layer"          # a whole transformer block (the layer stage): its cases are "layer-tp<N>-<variant>"
COLUMN_OPS = ("qkv", "fc1")
ROW_OPS = ("proj", "fc2")
# GEMMs TE can overlap, per op (TE names them "<op>_<gemm>").
OP_GEMMS = {
    "qkv": ("fprop", "dgrad", "wgrad"),
    "proj": ("fprop", "dgrad"),
    "fc1": ("fprop", "dgrad", "wgrad"),
    "fc2": ("fprop", "dgrad"),
}
TE_GEMMS = tuple(f"{op}_{g}" for op in ("qkv", "proj", "fc1", "fc2") for g in OP_GEMMS[op])


def parallel_kind(op: str) -> str:
    if op in COLUMN_OPS:
        return "column"
    if op in ROW_OPS:
        return "row"
    raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")


@dataclass(frozen=True)
class OpShape:
    """One shape an op runs at under its userbuffers name: [k_in, n_out] full weight, in ``layers``
    layers of the model (so ``layers`` times per step and micro-batch), as ``what``."""
    op: str
    k_in: int
    n_out: int
    layers: int
    what: str          # attention | dense MLP | shared expert


def op_shapes(op: str, mc: ModelConfig) -> list[OpShape]:
    """Every shape ``op`` runs at under TP comm overlap in this model (Megatron-core initialises one
    communicator config per name, so one config serves them all): attention's qkv/proj in every layer
    (none for qkv under multi-latent attention: its projections have other names, tptune.te.traps), fc1/fc2
    of the dense MLP in dense layers and of the shared experts in MoE layers. Routed experts are never
    here (TE's GroupedLinear and Megatron's expert linears have no userbuffers path: ``layer_linears``)."""
    m = mc.model
    layers = m.num_layers or 1
    h = m.hidden_size
    g = 2 if m.gated_mlp else 1
    if op == "qkv":
        return [] if m.is_mla else [OpShape(op, h, m.qkv_out, layers, "attention")]
    if op == "proj":
        return [OpShape(op, m.q_size, h, layers, "attention")]
    if op in ("fc1", "fc2"):
        return [OpShape(op, h, w * g, n, what) if op == "fc1" else OpShape(op, w, h, n, what)
                for what, w, n in m.mlp_widths()]
    raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")


def overlap_ops(mc: ModelConfig) -> tuple[str, ...]:
    """The ops this model runs under TP comm overlap (those with a shape): what ``ops: auto`` tunes."""
    return tuple(op for op in OPS if op_shapes(op, mc))


def primary_shape(op: str, mc: ModelConfig) -> OpShape:
    """The op's most frequent shape: the one that runs in most layers (the first on a tie); where an op has
    several, its cases are measured at all (worker.harness) and this one gets the trace and check. Raises
    ValueError naming why when the op has no shape under TP overlap in this model."""
    shapes = op_shapes(op, mc)
    if not shapes:
        m = mc.model
        why = ("multi-latent attention has no linear_qkv (its q/kv down and up projections are not TP-overlap "
               "ops in Megatron-core)" if op == "qkv" else
               "every layer is an MoE layer without shared experts: its fc1/fc2 are routed experts, which never run "
               "under TP comm overlap")
        raise ValueError(f"op {op}: nothing to tune in {m.name}: {why}")
    return max(shapes, key=lambda s: s.layers)


def weight_shape(op: str, mc: ModelConfig) -> tuple[int, int]:
    """Full (unsharded) weight as [in_features, out_features] (seed 000 TASK 0) of the shape the op's
    cases measure (``primary_shape``)."""
    s = primary_shape(op, mc)
    return s.k_in, s.n_out


def op_mix(op: str, mc: ModelConfig) -> list[tuple[OpShape, float]]:
    """The op's shapes and the share of the op's runs per step each has (layers / all its layers)."""
    shapes = op_shapes(op, mc)
    total = sum(s.layers for s in shapes) or 1
    return [(s, s.layers / total) for s in shapes]


@dataclass(frozen=True)
class Linear:
    """One linear of the model, overlapped or not: where it runs, its full weight, how many per layer."""
    module: str        # Megatron-core module, e.g. self_attention.linear_qkv, mlp.experts (routed)
    k_in: int
    n_out: int
    per_layer: int     # instances per layer (routed experts: the expert count)
    layers: int        # layers that have it
    op: str | None     # the userbuffers name it runs under (qkv/proj/fc1/fc2), None for none
    overlap: bool      # whether Megatron-core can run it with TP comm overlap
    why: str = ""      # why not (or the condition)


def attention_linears(m: ModelSpec, layers: int = 1) -> list[Linear]:
    """The attention linears of the model's layers, in ``layers`` layers (``layer_linears``' first rows;
    memory.attention_params counts their weights)."""
    L, h = layers, m.hidden_size
    out: list[Linear] = []
    if m.is_mla:
        nope, rope, v, heads = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim, m.num_attention_heads
        name_off = "its tp_comm_buffer_name is not qkv/proj/fc1/fc2: Megatron-core switches overlap off (tptune.te.traps)"
        if m.q_lora_rank:
            out += [Linear("self_attention.linear_q_down_proj", h, m.q_lora_rank, 1, L, None, False, name_off),
                    Linear("self_attention.linear_q_up_proj", m.q_lora_rank, heads * (nope + rope), 1, L, None, False,
                           name_off)]
        else:
            out.append(Linear("self_attention.linear_q_proj", h, heads * (nope + rope), 1, L, None, False, name_off))
        out += [Linear("self_attention.linear_kv_down_proj", h, m.kv_lora_rank + rope, 1, L, None, False, name_off),
                Linear("self_attention.linear_kv_up_proj", m.kv_lora_rank, heads * (nope + v), 1, L, None, False,
                       name_off),
                Linear("self_attention.linear_proj", heads * v, h, 1, L, "proj", True,
                       "only where built before the first MLA projection (tptune.te.traps)")]
    else:
        out += [Linear("self_attention.linear_qkv", h, m.qkv_out, 1, L, "qkv", True),
                Linear("self_attention.linear_proj", m.q_size, h, 1, L, "proj", True)]
    return out


def layer_linears(mc: ModelConfig) -> list[Linear]:
    """Every linear of the model's layers (and MTP blocks), with whether TP comm overlap can reach it
    (Megatron-core 0.19: extensions/transformer_engine.py, transformer/moe/*, multi_latent_attention.py,
    multi_token_prediction.py; TE module/grouped_linear.py). The docs/models.md table is made of these."""
    m = mc.model
    L, h, g = m.num_layers or 1, m.hidden_size, 2 if m.gated_mlp else 1
    out = attention_linears(m, L)
    if m.dense_layers:
        n = m.dense_layers
        out += [Linear("mlp.linear_fc1 (dense layers)", h, m.ffn_hidden_size * g, 1, n, "fc1", True),
                Linear("mlp.linear_fc2 (dense layers)", m.ffn_hidden_size, h, 1, n, "fc2", True)]
    if m.is_moe:
        n, e, w = m.moe_layers, m.num_moe_experts, m.moe_ffn_hidden_size
        experts = "routed experts (TEGroupedLinear / SequentialMLP): TE has no userbuffers path for them"
        out += [Linear("mlp.router", h, e, 1, n, None, False, "replicated GEMM, no TP collective"),
                Linear("mlp.experts.linear_fc1 (routed)", h, w * g, e, n, None, False, experts),
                Linear("mlp.experts.linear_fc2 (routed)", w, h, e, n, None, False, experts)]
        if m.moe_shared_expert_intermediate_size:
            s = m.moe_shared_expert_intermediate_size
            cond = "off under moe_shared_expert_overlap (tptune.te.traps)"
            on = not m.moe_shared_expert_overlap
            out += [Linear("mlp.shared_experts.linear_fc1", h, s * g, 1, n, "fc1", on, cond),
                    Linear("mlp.shared_experts.linear_fc2", s, h, 1, n, "fc2", on, cond)]
    if m.mtp_num_layers:
        out.append(Linear("mtp.layers.eh_proj", 2 * h, h, 1, m.mtp_num_layers, None, False,
                          "tp_comm_buffer_name mtp_eh_proj: switches overlap off for what is built after it"))
    return out


@dataclass(frozen=True)
class Gemm:
    """One sharded GEMM on one rank: [m, k] x [k, n], and the collective TE overlaps with it."""
    op: str
    tp: int
    gemm: str            # fprop | dgrad | wgrad
    m: int
    k: int
    n: int
    collective: str      # all_gather | reduce_scatter | none
    comm_elems: int      # elements of the full (gathered) buffer the collective moves

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def shape_key(self) -> str:
        """Seed 004's key for a per-shape chunk count: "[m, k, n]"."""
        return f"[{self.m}, {self.k}, {self.n}]"


def op_gemms(op: str, tp: int, mc: ModelConfig) -> list[Gemm]:
    """fprop/dgrad/wgrad of ``op`` on one rank at TP size ``tp`` (with sequence parallelism)."""
    t = mc.workload.tokens
    k_in, n_out = weight_shape(op, mc)
    h = mc.model.hidden_size
    if parallel_kind(op) == "column":
        n = n_out // tp
        return [
            Gemm(op, tp, "fprop", t, k_in, n, "all_gather", t * k_in),
            Gemm(op, tp, "dgrad", t, n, k_in, "all_gather", t * k_in),
            Gemm(op, tp, "wgrad", n, t, k_in, "reduce_scatter", t * k_in),
        ]
    k = k_in // tp
    return [
        Gemm(op, tp, "fprop", t, k, n_out, "reduce_scatter", t * h),
        Gemm(op, tp, "dgrad", t, n_out, k, "all_gather", t * h),
        Gemm(op, tp, "wgrad", k, t, n_out, "none", 0),
    ]

"""Traps: what switches TP comm overlap off in training, named before any GPU job.

Each trap is one line for ``tptune validate`` and the report, with what to do. Errors refuse the run
(settings.resolve); warnings are printed and reported. Read from Megatron-core 0.19 and its main
branch (megatron/core/extensions/transformer_engine.py TELinear.__init__, transformer/moe/*,
transformer/multi_latent_attention.py, multi_token_prediction.py) and TE (module/base.py
initialize_ub, module/grouped_linear.py), as issue 29 records them:

- ``mla_buffer_names``: any tp_comm_buffer_name outside qkv/proj/fc1/fc2 makes TELinear set
  ``config.tp_comm_overlap = False`` on the TransformerConfig every layer shares ("for this layer",
  says its warning). MLA's linear_q_down_proj / linear_q_up_proj / linear_q_proj / linear_kv_down_proj
  / linear_kv_up_proj carry such names, so at most the first layer's linear_proj keeps overlap.
- ``mtp_buffer_name``: MTP's eh_proj (buffer ``mtp_eh_proj``) does the same for everything built after
  it: the MTP layers; the decoder's layers, built before, keep theirs.
- ``shared_expert_overlap``: ``moe_shared_expert_overlap`` overlaps the shared expert with the token
  dispatcher instead; its fc1/fc2 then run without TP comm overlap.
- ``ops_without_overlap`` (error): an op asked for that has no shape under TP overlap in this model
  (qkv under MLA; fc1/fc2 when every layer is MoE without shared experts).
- ``tp1``: TP = 1 has no TP collective, nothing to overlap.
- ``sequence_parallel_off``: TE userbuffers overlap needs sequence parallelism (Megatron asserts it).
- ``packed_sequences``: userbuffers are sized for a constant seq*mbs (TE checks the exact size);
  packed THD micro-batches and token-count dynamic batching cannot use them unless padded.
- ``te_version``: the knob rules (search/ubcfg.py) were read at TE 2.20; an older TE on the node may
  not know the newer knobs the run's search uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from tptune.model.spec import ModelConfig
from tptune.model.ops import layer_linears, op_mix, op_shapes, overlap_ops

TE_RULES_VERSION = (2, 20)      # search/ubcfg.py's knob rules were read at this TE
# knobs whose TE support is only checked against TE_RULES_VERSION (older TEs may not take them)
NEWER_KNOBS = ("comm_priority", "gemm_priority", "pipeline_rs_overlap_first_gemm")


@dataclass(frozen=True)
class Trap:
    code: str
    level: str          # error | warning
    text: str
    todo: str

    @property
    def line(self) -> str:
        return f"{self.level} [{self.code}]: {self.text} What to do: {self.todo}"


def _te_version() -> tuple[int, int] | None:
    try:
        for name in ("transformer-engine", "transformer_engine"):
            try:
                v = metadata.version(name)
                major, minor = v.split(".")[:2]
                return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
            except metadata.PackageNotFoundError:
                continue
    except Exception:  # noqa: BLE001 - an unreadable version is an unknown one
        return None
    return None


def model_traps(mc: ModelConfig, ops=("qkv", "proj", "fc1", "fc2"), tp_sizes=(), *,
                knobs_used=(), te_version: tuple[int, int] | None = None) -> list[Trap]:
    """Every trap of this model and run (errors first). ``knobs_used``: TE knob names the run's search
    may set; ``te_version``: the TE on the node (None: not installed or unknown, the check is silent)."""
    m, w = mc.model, mc.workload
    out: list[Trap] = []
    for op in ops:
        if not op_shapes(op, mc):
            out.append(Trap("ops_without_overlap", "error", f"op {op}: nothing to tune in {m.name}: "
                            f"{no_overlap_why(op, mc)}.",
                            f"remove {op} from 'ops' (this model's TP-overlap ops: {', '.join(overlap_ops(mc))}; "
                            "or leave 'ops' out: its default, auto, takes those)."))
    if m.is_mla:
        names = [x.module.split(".")[-1] for x in layer_linears(mc) if x.module.startswith("self_attention.")
                 and x.op is None]
        out.append(Trap(
            "mla_buffer_names", "warning",
            f"multi-latent attention builds {', '.join(names)} with tp_comm_buffer_names outside qkv/proj/fc1/fc2; "
            "Megatron-core's TELinear (0.19 and main) then sets tp_comm_overlap=False on the config all layers "
            "share, so in training only modules built before the first MLA projection overlap: at most layer 1's "
            f"linear_proj. Every other layer's proj and every fc1/fc2 ({_mlp_where(mc)}) runs without TP overlap.",
            "tuning proj/fc1/fc2 here measures overlap training will not get: patch TELinear to switch overlap off "
            "for that module only (not on the shared config), or decide the TP size with overlap off."))
    if m.mtp_num_layers:
        out.append(Trap(
            "mtp_buffer_name", "warning",
            f"multi-token prediction ({m.mtp_num_layers} MTP layer(s)) builds eh_proj with buffer name mtp_eh_proj, "
            "which sets tp_comm_overlap=False on the shared config: the decoder's "
            f"{m.num_layers or '?'} layers (built before) keep overlap, the MTP layer(s) and anything built after "
            "them lose it (a Megatron-Bridge issue reports it).",
            "expect no overlap in the MTP layers; the tuned configs apply to the decoder layers."))
    if m.moe_shared_expert_overlap and m.moe_shared_expert_intermediate_size:
        dense = m.dense_layers
        out.append(Trap(
            "shared_expert_overlap", "warning",
            "moe_shared_expert_overlap is set: Megatron-core overlaps the shared expert with the token dispatcher "
            f"and runs its fc1/fc2 without TP comm overlap ({m.moe_layers} MoE layers); "
            + (f"fc1/fc2 choices apply to the {dense} dense layer(s) only." if dense else
               "no fc1/fc2 of this model then runs with TP overlap."),
            "turn moe_shared_expert_overlap off to use the fc1/fc2 choices on the shared experts, or drop fc1/fc2 "
            "from 'ops' if no dense layer is left."))
    if 1 in set(tp_sizes):
        out.append(Trap("tp1", "warning", "TP=1 is among tp_sizes: it has no TP collective, so nothing to overlap; "
                        "its sessions time the unsharded GEMMs (the TP decision's baseline) only.",
                        "keep it for the TP decision; no overlap config is emitted for TP=1."))
    if not w.sequence_parallel:
        out.append(Trap("sequence_parallel_off", "warning",
                        "sequence parallelism is off (workload.sequence_parallel: false): TE userbuffers overlap "
                        "needs it (Megatron refuses tp_comm_overlap without sequence_parallel), so none of the "
                        "tuned configs can be used.",
                        "train with --sequence-parallel, or tune the TP size only."))
    if w.packed_sequences:
        out.append(Trap("packed_sequences", "warning",
                        "workload.packed_sequences: packed variable-length (THD) micro-batches or token-count "
                        "dynamic batching change seq*mbs per step; userbuffers are allocated for one fixed "
                        f"[{w.seq_length}*{w.micro_batch_size}, hidden] shape and TE checks the exact size, so "
                        "TP comm overlap cannot run on them.",
                        f"pad every micro-batch to seq_length={w.seq_length} (the static maximum) to use the tuned "
                        "configs, or train with tp_comm_overlap off."))
    if te_version is not None and te_version < TE_RULES_VERSION:
        newer = [k for k in NEWER_KNOBS if k in set(knobs_used)]
        if newer:
            out.append(Trap("te_version", "warning",
                            f"Transformer Engine {te_version[0]}.{te_version[1]} is older than the TE "
                            f"{TE_RULES_VERSION[0]}.{TE_RULES_VERSION[1]} tptune's knob rules were read at; the "
                            f"search uses {', '.join(newer)}, which that TE may not take.",
                            "use TE >= 2.20, or leave those knobs out of search.knobs."))
    return sorted(out, key=lambda t: t.level != "error")


def no_overlap_why(op: str, mc: ModelConfig) -> str:
    """Why ``op`` has no shape under TP overlap in this model (op_shapes is empty)."""
    if op == "qkv":
        return "multi-latent attention has no linear_qkv; its q/kv projections run under other buffer names"
    return ("every layer is an MoE layer without shared experts: fc1/fc2 are routed experts, which TE's "
            "GroupedLinear and Megatron's expert linears never run with userbuffers")


def auto_ops_note(mc: ModelConfig) -> str:
    """What ``ops: auto`` (the default) tunes in this model, and which ops it leaves out and why: one line
    for ``tptune validate`` and the report."""
    ops = overlap_ops(mc)
    out = [op for op in ("qkv", "proj", "fc1", "fc2") if op not in ops]
    line = f"ops: {', '.join(ops)}: the default (ops: auto) takes the ops {mc.model.name} runs under TP overlap"
    if not out:
        return line + "."
    return line + f"; it leaves out {', '.join(out)}: {'; '.join(dict.fromkeys(no_overlap_why(op, mc) for op in out))}."


def _mlp_where(mc: ModelConfig) -> str:
    parts = [f"{what} in {n} layer(s)" for what, _, n in mc.model.mlp_widths()]
    return ", ".join(parts) or "none"


def knobs_in(config: dict) -> set[str]:
    """TE knob names a run config's search may set (search.knobs, run-wide or per op)."""
    found: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                found.add(str(k))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk((config.get("search") or {}).get("knobs"))
    for o in (config.get("op_settings") or {}).values():
        walk(((o or {}).get("search") or {}).get("knobs"))
    return found


def run_traps(config: dict, mc: ModelConfig, te_version=...) -> list[Trap]:
    """The traps of a merged run config and its model."""
    tev = _te_version() if te_version is ... else te_version
    traps = model_traps(mc, config.get("ops") or (), config.get("tp_sizes") or (), knobs_used=knobs_in(config),
                        te_version=tev)
    if mc.model.is_mla and (config.get("layer") or {}).get("enabled", True):
        traps.append(Trap(
            "mla_layer_stage", "warning",
            "the layer stage builds standard attention with this model's heads and head size: neither backend builds "
            "multi-latent attention yet, so the block's figures leave MLA's projections out.",
            "read the block's ratios as those of the proj/fc1/fc2 choices with standard attention; the per-op "
            "figures stand as they are."))
    return traps


def config_problems(config: dict, mc: ModelConfig | None) -> list[str]:
    """The traps that refuse a run (settings.resolve)."""
    if mc is None:
        return []
    return [f"field 'ops': {t.text} {t.todo}" for t in run_traps(config, mc, te_version=None) if t.level == "error"]


def report_md(config: dict, mc: ModelConfig) -> str:
    """The report's section: every linear of the layer, overlapped or outside TP overlap, each op's shapes
    and how often each runs, and the traps."""
    m = mc.model
    lines = ["| linear (Megatron-core) | [in, out] | per layer | layers | TP overlap |",
             "|:--|:--|--:|--:|:--|"]
    for x in layer_linears(mc):
        ov = (f"yes ({x.op})" if x.overlap else f"no: {x.why}") + (f"; {x.why}" if x.overlap and x.why else "")
        lines.append(f"| {x.module} | [{x.k_in}, {x.n_out}] | {x.per_layer} | {x.layers} | {ov} |")
    if m.is_moe:
        lines += ["", "Routed experts, the router and the expert-parallel / expert-TP token dispatch (NCCL all-to-all "
                      "or all-gather in Megatron's token dispatcher) run outside TP comm overlap; their share of the "
                      "layer is not measured by the per-op stage (the layer stage times them inside the whole block)."]
    for op in ("fc1", "fc2"):
        mix = op_mix(op, mc)
        if len(mix) < 2:
            continue
        lines.append("")
        lines.append(f"{op} runs at {len(mix)} shapes under one communicator config: "
                     + "; ".join(f"{s.what} [{s.k_in}, {s.n_out}] in {s.layers} layers ({share:.0%} of its "
                                 "runs per step)" for s, share in mix)
                     + ". Its cases measure every shape each round and are chosen on this mix (Answer per op).")
    traps = run_traps(config, mc)
    lines += ["", "Traps:" if traps else "Traps: none."]
    lines += [f"- {t.line}" for t in traps]
    return "\n".join(lines)

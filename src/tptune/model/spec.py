"""Model shape and workload: read Megatron-style YAML or a Hugging Face config.json, validate.

The four linear ops only need a handful of numbers; everything else in those files is ignored.
The memory check (``tptune.model.memory``) also needs the layer count, the vocabulary size and whether
the output layer shares the embedding's weights. Those three fields are optional here: a file
without them still tunes the ops, and the memory check names the field it is missing.

Families (docs/models.md has the table): a Hugging Face config is read by its ``model_type``
(``HF_FAMILIES``): whether the MLP is gated is the family's (transformers' *MLP classes gate whatever
``hidden_act`` says), the activation by name, ``head_dim`` when given (Gemma, Qwen3, Mistral-Nemo:
not hidden/heads), biases, experts (count, top-k, routed and shared width, which layers are MoE),
multi-latent attention (DeepSeek) and multi-token prediction. A family it does not know is refused
naming ``model_type``. A Megatron-style YAML uses Megatron-core's TransformerConfig names; an unknown
key is refused with the nearest known one. Which of these ops TE can overlap is ``tptune.model.ops``;
what Megatron-core silently switches off is ``tptune.te.traps``.

FP8 workloads (``dtype: fp8``, aliases in ``_FP8_ALIASES``) run their GEMMs in FP8 through Transformer
Engine with a ``recipe`` (``FP8_RECIPES``; default ``delayed``) and an ``fp8_format`` (``hybrid``:
E4M3 forward, E5M2 gradients, the default of TE's DelayedScaling/Float8CurrentScaling and of NeMo's
FP8 mixed precision; ``e4m3``: E4M3 both ways). Parameters, master weights and the activations
between GEMMs stay bf16 (``Workload.params_dtype``), as Megatron keeps them: TE quantizes inside its
modules. Communication follows TE's FP8 rules (``Workload.comm_bytes``): the sequence-parallel
all-gathers move FP8 (TE quantizes before gathering; userbuffers AG buffers are FP8 in FP8 mode),
the reduce-scatters move bf16 (a GEMM's output is high precision; only a userbuffers ``pipeline``
RS with ``fp8_buf`` reduces in FP8, which is a per-config choice, not the workload's).

Which GPUs run which recipe (TE 2.20, transformer_engine/pytorch/quantization.py,
NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b, _compute_*_support): delayed and
current need compute capability >= 8.9 (Ada, Hopper, Blackwell); block (Float8BlockScaling) >= 9.0
and CUDA >= 12.9; mxfp8 and nvfp4 >= 10.0 (Blackwell; mxfp8 not on 12.x consumer Blackwell yet).
``recipe_device_problem`` applies that rule to the compute capability when it is known (torch.cuda
on the node) and otherwise to a GPU name (``hardware.gpu`` or a device string such as
"NVIDIA H100 80GB HBM3"): a name that is recognisably Hopper/Ada/Ampere is refused for the recipes
it cannot run; an unknown or absent name is not refused at config time (the worker's TE refuses it
on the GPU, with TE's own reason, before anything is timed).

The torch backend has no FP8 GEMMs. An FP8 workload on it is refused at startup (settings.resolve,
``fp8_backend_problem``) unless ``fp8_emulation: bf16`` asks for the torch backend's bf16
emulation: it then runs every GEMM in bf16 (``TORCH_DTYPES["fp8"]`` is bf16) and
``Workload.precision_label`` says so, for the report.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tptune.errors import ConfigError
from tptune.model.documents import load_yaml

# Bytes of the high-precision tensors (params, activations between GEMMs): fp8 keeps them bf16.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
}
# FP8 dtype aliases -> the fp8_format they imply (None: the default, hybrid). Megatron's --fp8-format
# takes e4m3 | hybrid; TE's Format enum E4M3 | HYBRID (E5M2 alone is refused by TE's recipes).
_FP8_ALIASES = {"fp8": None, "float8": None, "e4m3": "e4m3", "fp8_e4m3": "e4m3", "float8_e4m3": "e4m3",
                "hybrid": "hybrid", "fp8_hybrid": "hybrid"}
FP8_FORMATS = ("hybrid", "e4m3")
# recipe -> TE recipe class (transformer_engine.common.recipe, TE 2.20) and Megatron's --fp8-recipe
# name (megatron/core/enums.py Fp8Recipe; nvfp4 is Megatron's --fp4-recipe nvfp4).
FP8_RECIPES = {
    "delayed": ("DelayedScaling", "delayed"),
    "current": ("Float8CurrentScaling", "tensorwise"),
    "block": ("Float8BlockScaling", "blockwise"),
    "mxfp8": ("MXFP8BlockScaling", "mxfp8"),
    "nvfp4": ("NVFP4BlockScaling", "nvfp4"),
}
_RECIPE_ALIASES = {"delayed": "delayed", "delayed_scaling": "delayed",
                   "current": "current", "current_scaling": "current", "tensorwise": "current",
                   "per_tensor": "current",
                   "block": "block", "blockwise": "block", "block_scaling": "block",
                   "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
DEFAULT_RECIPE = "delayed"
FP8_EMULATIONS = ("bf16",)
# Minimum compute capability per recipe (TE 2.20 quantization.py, see the module doc).
RECIPE_MIN_CC = {"delayed": (8, 9), "current": (8, 9), "block": (9, 0), "mxfp8": (10, 0), "nvfp4": (10, 0)}
RECIPE_MAX_CC = {"mxfp8": (12, 0)}   # TE: "MXFP8 ... is not supported on 12.0+ architectures yet"
# GPU names -> compute capability, for config validation without a GPU (matched case-insensitively
# as whole tokens in hardware.gpu or a device string; the first match wins: Blackwell names first,
# so "GB200" is not read as an Ampere "B200"-less string).
_GPU_CC = (
    (r"gb300|b300", (10, 3)), (r"gb200|b200|b100", (10, 0)), (r"rtx\s*pro\s*6000\s*blackwell|rtx\s*50\d0", (12, 0)),
    (r"gh200|h200|h100|h800|h20|sm_?90|hopper", (9, 0)),
    (r"l40s?|l4|rtx\s*40\d0|rtx\s*6000\s*ada|sm_?89|ada", (8, 9)),
    (r"a100|a800|a30|a10g?|sm_?80|sm_?86|ampere", (8, 0)),
)
FP8_PEAK_TFLOPS_DEFAULT = 1979.0   # dense FP8 of an H100/H200 SXM (bf16: 989)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    gated_mlp: bool
    # Optional (None: not in the model file); needed by the memory check only. Megatron's names, so
    # that to_dict() re-parses as the same spec (the worker rebuilds the model from that dict).
    num_layers: int | None = None
    vocab_size: int | None = None
    untie_embeddings_and_output_weights: bool | None = None   # None: the file does not say
    # Everything below is optional too (None: absent, the dense Llama-like default), with Megatron-core's
    # TransformerConfig / MLATransformerConfig names, so that to_dict() re-parses as the same spec.
    activation: str | None = None                 # ACTIVATIONS; None: silu when gated, else gelu
    add_qkv_bias: bool | None = None              # bias on linear_qkv (Qwen2, GPT-OSS)
    add_bias_linear: bool | None = None           # bias on every other linear (proj, fc1, fc2; experts)
    num_moe_experts: int | None = None            # routed experts per MoE layer
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None        # one routed expert's width
    moe_shared_expert_intermediate_size: int | None = None   # all shared experts of a layer together
    moe_layer_freq: int | tuple | None = None     # int k: layer i is MoE iff i % k == 0; tuple: 1 = MoE per layer
    moe_shared_expert_overlap: bool | None = None  # Megatron's switch: takes the shared expert out of TP overlap
    multi_latent_attention: bool | None = None
    q_lora_rank: int | None = None                # None with MLA: one linear_q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None                # DeepSeek's qk_nope_head_dim
    qk_pos_emb_head_dim: int | None = None        # DeepSeek's qk_rope_head_dim
    v_head_dim: int | None = None
    mtp_num_layers: int | None = None             # multi-token prediction blocks (DeepSeek-V3's nextn)

    # --- MoE layout -------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return bool(self.num_moe_experts)

    @property
    def is_mla(self) -> bool:
        return bool(self.multi_latent_attention)

    def moe_pattern(self) -> list[bool] | None:
        """Per layer, whether it is an MoE layer (None: a dense model, or an MoE model whose layer count
        is not given and whose pattern is not every layer). One entry per layer: the counts below
        (moe_layers_in, layer_count) never build it."""
        n = self.layer_count
        return None if n is None else [self.moe_layers_in(i, i + 1) == 1 for i in range(n)]

    @property
    def layer_count(self) -> int | None:
        """The model's layers: num_layers, or the length of a per-layer moe_layer_freq (None: not given)."""
        f = self.moe_layer_freq
        return len(f) if self.is_moe and isinstance(f, (tuple, list)) else self.num_layers

    def moe_layers_in(self, start: int, stop: int) -> int:
        """MoE layers among layers [start, stop), counted without a list per layer (num_layers may be
        huge): an int moe_layer_freq k makes layer i MoE iff i % k == 0."""
        if not self.is_moe or stop <= start:
            return 0
        f = 1 if self.moe_layer_freq is None else self.moe_layer_freq
        if isinstance(f, (tuple, list)):
            return sum(bool(x) for x in f[start:stop])
        return -(-stop // f) - -(-start // f)     # the multiples of f in [start, stop)

    @property
    def moe_layers(self) -> int:
        """MoE layers of the model (all of them when the layer count is unknown and every layer is MoE)."""
        n = self.layer_count
        return self.moe_layers_in(0, n) if n is not None else (1 if self.is_moe else 0)

    @property
    def dense_layers(self) -> int:
        n = self.layer_count
        return (n - self.moe_layers_in(0, n)) if n is not None else (0 if self.is_moe else 1)

    def block_pattern(self, n: int) -> list[bool]:
        """Which of the layer stage's ``n`` layers are MoE layers: every one for an MoE model, except the
        first when the model also has dense layers (the block then runs both kinds); none when dense."""
        if not self.is_moe:
            return [False] * n
        return [not (i == 0 and self.dense_layers and n > 1) for i in range(n)]

    @property
    def activation_name(self) -> str:
        return self.activation or ("silu" if self.gated_mlp else "gelu")

    def mlp_widths(self) -> list[tuple[str, int, int]]:
        """The MLPs that run as Megatron's fc1/fc2 (column/row TP linears, userbuffers names fc1/fc2), as
        (what, width, layers): the dense MLP of non-MoE layers and the shared experts of MoE layers.
        Routed experts are not here: they never run under TP comm overlap (see ops.layer_linears)."""
        out = []
        if self.dense_layers:
            out.append(("dense MLP", self.ffn_hidden_size, self.dense_layers))
        if self.moe_layers and self.moe_shared_expert_intermediate_size:
            out.append(("shared expert", self.moe_shared_expert_intermediate_size, self.moe_layers))
        return out

    @property
    def q_size(self) -> int:
        """Input width of linear_proj: heads x head size (MLA: heads x v_head_dim, kept as kv_channels)."""
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_size(self) -> int:
        return self.num_query_groups * self.kv_channels

    @property
    def qkv_out(self) -> int:
        return self.q_size + 2 * self.kv_size

    @property
    def fc1_out(self) -> int:
        return self.ffn_hidden_size * (2 if self.gated_mlp else 1)


@dataclass(frozen=True)
class Workload:
    seq_length: int
    micro_batch_size: int = 1
    dtype: str = "bf16"
    # FP8 only (None otherwise): the TE recipe (FP8_RECIPES), its format, and the torch backend's
    # explicit bf16 emulation (None: refused on the torch backend).
    recipe: str | None = None
    fp8_format: str | None = None
    fp8_emulation: str | None = None
    # Packed variable-length (THD) micro-batches or token-count dynamic batching: userbuffers need a
    # constant seq*mbs, so TP comm overlap cannot run on them unless padded (a trap, tptune.te.traps).
    packed_sequences: bool = False
    # Megatron's sequence_parallel; TE userbuffers overlap needs it (a trap when off). The per-op and
    # layer sessions always measure with it on.
    sequence_parallel: bool = True

    @property
    def tokens(self) -> int:
        return self.seq_length * self.micro_batch_size

    @property
    def is_fp8(self) -> bool:
        return self.dtype == "fp8"

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of params and of the activations between GEMMs (bf16's 2 for fp8)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def ub_rules(self) -> str:
        """The userbuffers rule set (ubcfg.validate_ub_cfgs ``workload``): "fp8" admits TE's FP8 knobs."""
        return "fp8" if self.is_fp8 else "bf16"

    @property
    def params_dtype(self) -> str:
        """The dtype parameters and master weights are kept in: bf16 under FP8 (TE quantizes them)."""
        return "bf16" if self.is_fp8 else self.dtype

    def comm_bytes(self, collective: str | None) -> int:
        """Bytes per element a TP collective moves: FP8 all-gathers move 1 byte (TE quantizes before
        gathering), everything else the high-precision dtype. ``collective`` as in ops.op_gemms
        ("all_gather" / "reduce_scatter" / None; anything containing "gather" counts as an AG)."""
        if self.is_fp8 and self.fp8_emulation is None and collective and "gather" in collective:
            return 1
        return self.dtype_bytes

    def peak_tflops(self, hardware: dict | None = None, bf16_peak: float = 989.0) -> float:
        """The GEMM peak the plan's FLOP-time estimate uses: ``hardware.peak_tflops_fp8`` (default
        FP8_PEAK_TFLOPS_DEFAULT) for FP8, else ``hardware.peak_tflops`` (default ``bf16_peak``)."""
        hw = hardware or {}
        if self.is_fp8 and self.fp8_emulation is None:
            return float(hw.get("peak_tflops_fp8", FP8_PEAK_TFLOPS_DEFAULT))
        return float(hw.get("peak_tflops", bf16_peak))

    @property
    def precision_label(self) -> str:
        """What the report should say about the precision, e.g. "fp8 (delayed scaling, hybrid)" or,
        under the torch backend's emulation, that the GEMMs ran in bf16."""
        if not self.is_fp8:
            return self.dtype
        label = f"fp8 ({self.recipe} scaling, {self.fp8_format})" if self.recipe in ("delayed", "current", "block") \
            else f"fp8 ({self.recipe}, {self.fp8_format})"
        if self.fp8_emulation:
            label += f" requested; run as {self.fp8_emulation} (torch backend emulation: no FP8 GEMMs)"
        return label

    def to_dict(self) -> dict[str, Any]:
        """The fields as given; the FP8 ones only for an FP8 workload (so other dicts are unchanged)."""
        d = asdict(self)
        if not self.packed_sequences:
            d.pop("packed_sequences")
        if self.sequence_parallel:
            d.pop("sequence_parallel")
        if not self.is_fp8:
            for k in ("recipe", "fp8_format", "fp8_emulation"):
                d.pop(k)
        elif self.fp8_emulation is None:
            d.pop("fp8_emulation")
        return d


@dataclass(frozen=True)
class ModelConfig:
    model: ModelSpec
    workload: Workload
    source: str = field(default="<dict>", compare=False)

    def to_dict(self) -> dict[str, Any]:
        # Optional fields the file did not give are left out (the dict of such a file is unchanged).
        spec = {k: v for k, v in asdict(self.model).items()
                if v is not None or (k == "q_lora_rank" and self.model.is_mla)}   # MLA: null q_lora_rank is read
        return {"model": spec, "workload": self.workload.to_dict(), "source": self.source}

    def tp_problems(self, tp: int) -> list[str]:
        """What stops this model from running at tensor-parallel size ``tp`` (empty if nothing)."""
        m, w = self.model, self.workload
        checks = [
            ("num_attention_heads", m.num_attention_heads),
            ("num_query_groups", m.num_query_groups),
            ("ffn_hidden_size", m.ffn_hidden_size if m.dense_layers else 0),
            ("tokens (seq_length*micro_batch_size)", w.tokens),
            # experts: expert-tensor parallelism defaults to TP in Megatron-core
            ("moe_ffn_hidden_size", m.moe_ffn_hidden_size or 0),
            ("moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size or 0),
        ]
        return [f"TP={tp}: {name}={value} is not divisible by {tp}" for name, value in checks if value % tp]


# --- reading -----------------------------------------------------------------------------------

def _pick(raw: dict, names: tuple[str, ...]) -> tuple[str | None, Any]:
    for n in names:
        if n in raw and raw[n] is not None:
            return n, raw[n]
    return None, None


# The type of every field a model file is read by (issue 54: num_moe_experts "8" or 8.0 was read as a dense
# model, use_bias "false" as true, mlp_only_layers "0,1" a traceback): checked before the fields are read.
# A value of the wrong type is named with the type expected and then read as absent (``_typed``); a null
# is absent. Values are checked where they are read (a positive integer above 0, an activation's name).
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_KINDS = {
    "int+": (_is_int, "a positive integer"),
    "int": (_is_int, "an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "ints": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integers (layer indices)"),
    "strs": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}
_SIZES = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "num_layers", "vocab_size",
          "padded_vocab_size", "num_key_value_heads", "head_dim", "q_lora_rank", "kv_lora_rank", "v_head_dim")
_FLAGS = ("tie_word_embeddings", "untie_embeddings_and_output_weights", "share_embeddings_and_output_weights")
MEGATRON_FIELD_TYPES = {
    **dict.fromkeys(_SIZES + ("ffn_hidden_size", "num_query_groups", "kv_channels", "moe_router_topk",
                              "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "qk_head_dim",
                              "qk_pos_emb_head_dim"), "int+"),
    **dict.fromkeys(("num_moe_experts", "num_experts", "mtp_num_layers"), "int"),    # 0: none
    **dict.fromkeys(_FLAGS + ("gated_mlp", "gated_linear_unit", "swiglu", "add_qkv_bias", "add_bias_linear",
                              "moe_shared_expert_overlap", "multi_latent_attention", "bf16", "fp16"), "bool"),
    **dict.fromkeys(("activation", "name", "source"), "str"),
}   # moe_layer_freq: an integer, a list or Megatron's string, read by _moe_freq
HF_FIELD_TYPES = {
    **dict.fromkeys(_SIZES + ("intermediate_size_mlp", "qk_nope_head_dim", "qk_rope_head_dim", "num_experts_per_tok",
                              "experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size",
                              "decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq"), "int+"),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "n_shared_experts",
                     "first_k_dense_replace", "num_nextn_predict_layers"), "int"),      # 0: none
    **dict.fromkeys(_FLAGS + ("attention_bias", "mlp_bias", "use_bias"), "bool"),
    **dict.fromkeys(("model_type", "hidden_act", "hidden_activation", "name", "_name_or_path"), "str"),
    "mlp_only_layers": "ints", "moe_layers": "ints", "architectures": "strs",
}


def _typed(raw: dict, types: dict[str, str], problems: list[str], bad: dict[str, str]) -> dict:
    """``raw`` less its fields of the wrong type (``types``: field -> kind of _KINDS), each named in
    ``problems`` and kept in ``bad`` (field -> its problem), so no reader misreads it or trips on it."""
    out = {}
    for key, value in raw.items():
        kind = types.get(key)
        if value is not None and kind is not None and not _KINDS[kind][0](value):
            got = type(value).__name__
            bad[key] = f"field '{key}' = {value!r}: expected {_KINDS[kind][1]}, got {got}"
            problems.append(bad[key])
            continue
        out[key] = value
    return out


def _without_cascades(problems: list[str], bad: dict[str, str]) -> list[str]:
    """``problems`` less those that follow from a mistyped field (read as absent): a required field called
    missing, MoE fields called those of a dense model. Every other problem of the file stays."""
    if not bad:
        return problems
    named = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, bad)) + r")(?![\w])")
    own = set(bad.values())
    return [p for p in problems if p in own or not named.search(p)]


# Upper bounds far above any model trained (405B dense: 126 layers, hidden 16384, 128 heads; vocabularies
# to 256k; MoE to 512 experts): a value beyond is a typo, refused before planning touches it.
MAXIMA = {"num_layers": 100_000, "num_hidden_layers": 100_000, "mtp_num_layers": 1_000,
          "num_nextn_predict_layers": 1_000, "hidden_size": 1 << 20, "ffn_hidden_size": 1 << 24,
          "intermediate_size": 1 << 24, "moe_ffn_hidden_size": 1 << 24, "moe_intermediate_size": 1 << 24,
          "moe_shared_expert_intermediate_size": 1 << 24, "shared_expert_intermediate_size": 1 << 24,
          "num_attention_heads": 1 << 16, "num_query_groups": 1 << 16, "num_key_value_heads": 1 << 16,
          "kv_channels": 1 << 16, "head_dim": 1 << 16, "vocab_size": 1 << 26, "padded_vocab_size": 1 << 26,
          "num_moe_experts": 1 << 16, "num_experts": 1 << 16, "num_local_experts": 1 << 16,
          "n_routed_experts": 1 << 16}


def _positive_int(raw: dict, names: tuple[str, ...], problems: list[str], required=True) -> int | None:
    key, value = _pick(raw, names)
    if key is None:
        if required:
            problems.append(f"missing field '{names[0]}' (expected a positive integer"
                            + (f"; also accepted: {', '.join(names[1:])})" if len(names) > 1 else ")"))
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"field '{key}' = {value!r}: expected a positive integer, got {type(value).__name__}")
        return None
    if value <= 0:
        problems.append(f"field '{key}' = {value}: expected a positive integer")
        return None
    if key in MAXIMA and value > MAXIMA[key]:
        problems.append(f"field '{key}' = {value}: expected at most {MAXIMA[key]:,} (far beyond any model "
                        "trained; a typo?)")
        return None
    return value


def _dtype(value: Any, key: str, problems: list[str]) -> str | None:
    if isinstance(value, str) and value.lower() in _FP8_ALIASES:
        return "fp8"
    if not isinstance(value, str) or value.lower() not in _DTYPE_ALIASES:
        problems.append(f"field '{key}' = {value!r}: expected one of bf16, fp16, fp32, fp8 "
                        f"(fp8 aliases: {', '.join(a for a in _FP8_ALIASES if a != 'fp8')})")
        return None
    return _DTYPE_ALIASES[value.lower()]


FP8_FIELDS = ("recipe", "fp8_format", "fp8_emulation")


def _fp8_fields(wl: dict, dtype: str | None, problems: list[str]) -> tuple:
    """recipe, fp8_format, fp8_emulation of a workload dict (all None unless dtype is fp8)."""
    if dtype != "fp8":
        given = [k for k in FP8_FIELDS if wl.get(k) is not None]
        if given and dtype is not None:
            problems.append(f"workload: field(s) {given} apply to dtype fp8 only (dtype is {dtype})")
        return None, None, None
    raw_recipe = wl.get("recipe") or DEFAULT_RECIPE
    recipe = _RECIPE_ALIASES.get(str(raw_recipe).lower()) if isinstance(raw_recipe, str) else None
    if recipe is None:
        problems.append(f"field 'workload.recipe' = {raw_recipe!r}: expected one of {', '.join(FP8_RECIPES)} "
                        f"(aliases: tensorwise/per_tensor = current, blockwise = block)")
    implied = _FP8_ALIASES.get(str(wl.get("dtype", "fp8")).lower())
    fmt = wl.get("fp8_format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in FP8_FORMATS):
        problems.append(f"field 'workload.fp8_format' = {fmt!r}: expected one of {', '.join(FP8_FORMATS)}")
        fmt = None
    elif fmt is not None:
        fmt = fmt.lower()
        if implied and implied != fmt:
            problems.append(f"field 'workload.fp8_format' = {fmt!r} contradicts dtype {wl.get('dtype')!r} "
                            f"(which means fp8_format {implied})")
    fmt = fmt or implied or "hybrid"
    if recipe in ("mxfp8", "block") and fmt != "e4m3" and wl.get("fp8_format") is None and not implied:
        fmt = "e4m3"   # TE's own default for MXFP8BlockScaling and Float8BlockScaling
    if recipe == "nvfp4":
        fmt = "e4m3"   # NVFP4BlockScaling: E2M1 data, E4M3 scales (TE asserts it)
    emu = wl.get("fp8_emulation")
    if emu is not None and emu not in FP8_EMULATIONS:
        problems.append(f"field 'workload.fp8_emulation' = {emu!r}: expected {' or '.join(FP8_EMULATIONS)} "
                        "(the torch backend's bf16 emulation of an FP8 workload)")
        emu = None
    return recipe, fmt, emu


def gpu_capability(name: str | None) -> tuple[int, int] | None:
    """Compute capability a GPU name implies (hardware.gpu, a device string); None if unknown."""
    if not name:
        return None
    low = str(name).lower()
    for pattern, cc in _GPU_CC:
        if re.search(rf"(?<![a-z0-9])(?:{pattern})(?![a-z0-9])", low):
            return cc
    return None


def recipe_device_problem(recipe: str, *, capability: tuple[int, int] | None = None,
                          gpu: str | None = None) -> str | None:
    """Why ``recipe`` cannot run on this GPU (None if it can, or if the GPU is unknown). The compute
    capability wins when given (torch.cuda.get_device_capability on the node); else ``gpu``, a name."""
    cc = tuple(capability) if capability is not None else gpu_capability(gpu)
    if cc is None or recipe not in RECIPE_MIN_CC:
        return None
    what = f"{gpu}, " if gpu else ""
    where = f"the GPU ({what}compute capability {cc[0]}.{cc[1]})"
    lo, hi = RECIPE_MIN_CC[recipe], RECIPE_MAX_CC.get(recipe)
    if cc < lo:
        need = "Blackwell" if lo >= (10, 0) else ("Hopper" if lo >= (9, 0) else "Ada or Hopper")
        return (f"FP8 recipe {recipe!r} ({FP8_RECIPES[recipe][0]}) needs compute capability {lo[0]}.{lo[1]}+ "
                f"({need}); {where} cannot run it")
    if hi is not None and cc >= hi:
        return (f"FP8 recipe {recipe!r} ({FP8_RECIPES[recipe][0]}) is not supported by TE on compute capability "
                f"{hi[0]}.{hi[1]}+ yet; {where} cannot run it")
    return None


def fp8_backend_problem(workload: "Workload", backend: str) -> str | None:
    """The one line refusing an FP8 workload on the torch backend (None when it may run)."""
    if not workload.is_fp8 or backend != "torch" or workload.fp8_emulation:
        return None
    return ("workload dtype fp8 needs the te backend (Transformer Engine FP8 GEMMs on a GPU); the torch "
            "backend has no FP8 GEMMs: use backend: te on a GPU node, or set workload.fp8_emulation: bf16 "
            "to run the torch backend in bf16 (the report then says the GEMMs ran in bf16)")


def _untie(raw: dict, problems: list[str]) -> bool | None:
    """Whether the output layer has its own weights: Megatron's untie_embeddings_and_output_weights,
    Hugging Face's tie_word_embeddings or NeMo's share_embeddings_and_output_weights (both inverted).
    None when the file gives none of them (both frameworks then tie; tptune.model.memory says so)."""
    found = []
    for key, inverted in (("untie_embeddings_and_output_weights", False), ("tie_word_embeddings", True),
                          ("share_embeddings_and_output_weights", True)):
        if key in raw and raw[key] is not None:
            if not isinstance(raw[key], bool):
                problems.append(f"field '{key}' = {raw[key]!r}: expected true or false")
                return None
            found.append((key, raw[key] != inverted))
    if len({v for _, v in found}) > 1:
        problems.append("fields " + " and ".join(f"'{k}'" for k, _ in found) + " contradict each other")
        return None
    return found[0][1] if found else None


def is_hf_config(raw: dict) -> bool:
    return "intermediate_size" in raw or "num_key_value_heads" in raw or "model_type" in raw


def parse_model(raw: dict, source: str = "<dict>", workload: dict | None = None) -> ModelConfig:
    """Build a validated ModelConfig from a Megatron-style or Hugging Face dict.

    ``workload`` overrides the file's own workload fields (seq_length, micro_batch_size, dtype).
    Raises ConfigError listing every problem. A Hugging Face config is read by its family
    (``model_type``, HF_FAMILIES); a Megatron-style file by its keys, and a key it does not know is
    refused with the nearest known name (NeMo's nesting under ``model:``: only near-misses of known
    keys, its model block holds many keys of its own).
    """
    if not isinstance(raw, dict):
        raise ConfigError(source, [f"expected a mapping of model fields, got {type(raw).__name__}"])
    nemo = isinstance(raw.get("model"), dict) and "hidden_size" not in raw
    if nemo:  # NeMo nests under model:
        raw = {**raw["model"], **{k: v for k, v in raw.items() if k != "model"}}
    problems: list[str] = []
    bad: dict[str, str] = {}        # fields of the wrong type (_typed), read as absent
    hf = is_hf_config(raw)
    if hf:
        raw, fields = _read_hf(raw, problems, bad)
    else:
        raw = _typed(raw, MEGATRON_FIELD_TYPES, problems, bad)
        fields = _read_megatron(raw, problems, strict=not nemo)
    if fields.get("activation") == ("silu" if fields.get("gated_mlp") else "gelu"):
        fields["activation"] = None     # the default: left out of the spec's dict (as before this field)
    fields = {k: v for k, v in fields.items() if v is not None}
    heads, groups = fields.get("num_attention_heads"), fields.get("num_query_groups")
    if heads and groups and heads % groups:
        problems.append(f"field 'num_query_groups' = {groups}: must divide num_attention_heads={heads}")
    _check_moe(fields, problems)

    wl = dict(raw.get("workload") or {})
    for k in ("seq_length", "micro_batch_size", "dtype", "sequence_parallel"):
        if k in raw and k not in wl:
            wl[k] = raw[k]
    if "params_dtype" in raw and "dtype" not in wl:
        wl["dtype"] = raw["params_dtype"]
    if raw.get("bf16") is True and "dtype" not in wl:
        wl["dtype"] = "bf16"
    if hf and "torch_dtype" in raw and "dtype" not in wl:
        wl["dtype"] = raw["torch_dtype"]
    wl.update({k: v for k, v in (workload or {}).items() if v is not None})
    unknown = set(wl) - set(WORKLOAD_KEYS)
    if unknown:
        problems.append(f"workload: unknown field(s) {sorted(unknown)}"
                        + "".join(_nearest(k, WORKLOAD_KEYS) for k in sorted(unknown))
                        + f"; expected seq_length, micro_batch_size, dtype, packed_sequences "
                        f"(fp8: also {', '.join(FP8_FIELDS)})")
    seq = _positive_int(wl, ("seq_length",), problems)
    mbs = _positive_int({"micro_batch_size": wl.get("micro_batch_size", 1)}, ("micro_batch_size",), problems)
    dtype = _dtype(wl.get("dtype", "bf16"), "dtype", problems)
    recipe, fp8_format, fp8_emulation = _fp8_fields(wl, dtype, problems)
    packed, sp = wl.get("packed_sequences", False), wl.get("sequence_parallel", True)
    for key, v in (("packed_sequences", packed), ("sequence_parallel", sp)):
        if not isinstance(v, bool):
            problems.append(f"field 'workload.{key}' = {v!r}: expected true or false")
    packed, sp = packed is True, sp is not False

    name = model_name(raw, source)
    problems = _without_cascades(problems, bad)
    if problems:
        raise ConfigError(source, problems)
    return ModelConfig(
        model=ModelSpec(name=str(name), **fields),
        workload=Workload(seq, mbs, dtype, recipe, fp8_format, fp8_emulation, packed, sp),
        source=source,
    )


def model_name(raw: dict, source: str) -> str:
    """The model's name (the run folder's first part): the file's ``name``; else the last part of a Hugging Face
    ``_name_or_path`` ("Qwen/Qwen3-8B": Qwen3-8B); else the file's own name, except for a ``config.json``, which
    every Hugging Face model calls its file: then the folder holding it (a Hugging Face cache snapshot,
    models--<org>--<name>/snapshots/<hash>: its repository's name), else its first architecture. Characters a
    folder name should not carry become "-"."""
    if raw.get("name"):
        return str(raw["name"])
    path = Path(source)
    hf_name = raw.get("_name_or_path")
    if isinstance(hf_name, str) and hf_name.strip("/ "):
        name = hf_name.strip("/ ").replace("\\", "/").rsplit("/", 1)[-1]
    elif path.stem != "config":
        name = path.stem
    else:
        folder = Path(os.path.abspath(path)).parent
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
            folder = folder.parent.parent
        name = folder.name.removeprefix("models--").rsplit("--", 1)[-1]
        archs = raw.get("architectures")
        if not name and isinstance(archs, list) and archs and isinstance(archs[0], str):
            name = archs[0]
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-.") or "model"


WORKLOAD_KEYS = ("seq_length", "micro_batch_size", "dtype", "packed_sequences", "sequence_parallel", *FP8_FIELDS)
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "squared_relu")
# Megatron-style ``activation``: name -> (nonlinearity, gated or None: the name does not say)
_MEGATRON_ACTS = {"swiglu": ("silu", True), "geglu": ("gelu", True), "reglu": ("relu", True),
                  **{a: (a, None) for a in ACTIVATIONS}}
# Hugging Face hidden_act / hidden_activation -> nonlinearity (transformers' ACT2FN names)
_HF_ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
            "gelu_fast": "gelu_tanh", "gelu_tanh": "gelu_tanh", "relu": "relu", "relu2": "squared_relu"}
# Keys of a Megatron-style model file: the spec's own (ModelSpec's fields) and the aliases read here.
_SPEC_KEYS = tuple(k for k in ModelSpec.__dataclass_fields__ if k != "name")   # ModelSpec's fields, in order
_ALIAS_KEYS = ("intermediate_size", "num_key_value_heads", "head_dim", "num_hidden_layers", "padded_vocab_size",
               "tie_word_embeddings", "share_embeddings_and_output_weights", "gated_linear_unit", "swiglu",
               "num_experts")
_TOP_KEYS = ("name", "workload", "seq_length", "micro_batch_size", "dtype", "params_dtype", "bf16", "fp16", "source",
             "sequence_parallel")
# Megatron keys accepted and ignored: they change no linear op's shape and no memory term counted here.
IGNORED_MEGATRON_KEYS = (
    "normalization", "layernorm_epsilon", "norm_epsilon", "position_embedding_type", "rotary_base",
    "rotary_percent", "rotary_interleaved", "rotary_scaling_factor", "max_position_embeddings", "hidden_dropout",
    "attention_dropout", "init_method_std", "make_vocab_size_divisible_by", "qk_layernorm", "apply_rope_fusion",
    "bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm", "attention_softmax_in_fp32",
    "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_score_function",
    "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk",
    "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_token_dispatcher_type",
    "moe_grouped_gemm", "moe_router_dtype", "moe_permute_fusion", "mtp_loss_scaling_factor", "window_size",
    "rope_type", "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "original_max_position_embeddings")
MEGATRON_KEYS = _SPEC_KEYS + _ALIAS_KEYS + _TOP_KEYS + IGNORED_MEGATRON_KEYS


def _nearest(key: str, known) -> str:
    near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _bool(raw: dict, key: str, problems: list[str]) -> bool | None:
    if raw.get(key) is None:
        return None
    if not isinstance(raw[key], bool):
        problems.append(f"field '{key}' = {raw[key]!r}: expected true or false")
        return None
    return raw[key]


def _common(raw: dict, problems: list[str], hf: bool) -> dict:
    """Layers, vocabulary, tied embeddings: the same in both formats."""
    layers = _positive_int(raw, ("num_hidden_layers", "num_layers") if hf else ("num_layers", "num_hidden_layers"),
                           problems, required=False)
    return {"num_layers": layers, "vocab_size": _positive_int(raw, ("vocab_size", "padded_vocab_size"), problems,
                                                               required=False),
            "untie_embeddings_and_output_weights": _untie(raw, problems)}


def _attention(raw: dict, problems: list[str], hidden, heads, groups_keys, kv_keys) -> tuple:
    groups = _positive_int(raw, groups_keys, problems, required=False)
    kv = _positive_int(raw, kv_keys, problems, required=False)
    if groups is None and not any(raw.get(k) is not None for k in groups_keys):
        groups = heads  # plain multi-head attention
    if kv is None and not any(raw.get(k) is not None for k in kv_keys) and hidden and heads:
        if hidden % heads:
            problems.append(f"field '{kv_keys[0]}' missing and hidden_size={hidden} is not divisible by "
                            f"num_attention_heads={heads}: give {kv_keys[0]} explicitly")
        else:
            kv = hidden // heads
    return groups, kv


def _moe_freq(value, layers: int | None, problems: list[str]):
    """Megatron's moe_layer_freq: an int k, a list of 0/1 per layer, or the string "([0]*3+[1]*58)"."""
    if isinstance(value, str):
        parts = re.findall(r"\[\s*([01])\s*\]\s*\*\s*(\d+)", value)
        if not parts or re.sub(r"[\s()+]|\[\s*[01]\s*\]\s*\*\s*\d+", "", value):
            problems.append(f"field 'moe_layer_freq' = {value!r}: expected an integer, a list of 0/1 per layer "
                            "or Megatron's string form like '([0]*3+[1]*58)'")
            return None
        total = sum(int(n) for _, n in parts)
        if total > MAXIMA["num_layers"]:
            problems.append(f"field 'moe_layer_freq' = {value!r}: {total:,} layers, expected at most "
                            f"{MAXIMA['num_layers']:,}")
            return None
        value = [int(b) for b, n in parts for _ in range(int(n))]
    if isinstance(value, (list, tuple)):
        if not all(v in (0, 1) and not isinstance(v, bool) for v in value):
            problems.append(f"field 'moe_layer_freq': a list must hold 0 (dense) or 1 (MoE) per layer")
            return None
        if layers and len(value) != layers:
            problems.append(f"field 'moe_layer_freq': {len(value)} entries for num_layers={layers}")
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"field 'moe_layer_freq' = {value!r}: expected a positive integer or a list of 0/1")
        return None
    return None if value == 1 else value


def _read_megatron(raw: dict, problems: list[str], strict: bool) -> dict:
    """A Megatron-style (or NeMo) model file: Megatron-core's TransformerConfig names."""
    for key in raw:
        if key in MEGATRON_KEYS:
            continue
        hint = _nearest(key, _SPEC_KEYS + _ALIAS_KEYS + _TOP_KEYS)
        if strict:
            problems.append(f"unknown field '{key}'{hint}: a Megatron-style model file takes "
                            f"{', '.join(_SPEC_KEYS)} (and {', '.join(_ALIAS_KEYS)}; workload fields under "
                            "'workload'); see docs/models.md")
        elif hint:   # NeMo: its model block has many keys of its own; refuse only a near-miss of ours
            problems.append(f"unknown field '{key}'{hint}: it would be ignored and the model misread")
    hidden = _positive_int(raw, ("hidden_size",), problems)
    heads = _positive_int(raw, ("num_attention_heads",), problems)
    f = {"hidden_size": hidden, "num_attention_heads": heads,
         "ffn_hidden_size": _positive_int(raw, ("ffn_hidden_size", "intermediate_size"), problems), **_common(raw, problems, False)}
    mla = _bool(raw, "multi_latent_attention", problems)
    if mla:
        f.update(_mla(raw, problems, _MEGATRON_MLA_FIELDS, heads))
        for k in ("kv_channels", "head_dim"):
            if raw.get(k) is not None and raw[k] != f.get("v_head_dim"):
                problems.append(f"field '{k}' = {raw[k]}: with multi_latent_attention the head sizes are "
                                "qk_head_dim, qk_pos_emb_head_dim and v_head_dim; leave it out")
    else:
        for k in _MEGATRON_MLA_FIELDS:
            if raw.get(k) is not None:
                problems.append(f"field '{k}' = {raw[k]!r}: a multi-latent attention field, but "
                                "multi_latent_attention is not true (set it, or remove the field)")
        f["num_query_groups"], f["kv_channels"] = _attention(raw, problems, hidden, heads,
                                                             ("num_query_groups", "num_key_value_heads"),
                                                             ("kv_channels", "head_dim"))
    gated, act = False, None
    for k in ("gated_linear_unit", "swiglu", "gated_mlp"):
        v = _bool(raw, k, problems)
        gated = gated or bool(v)
    if raw.get("activation") is not None:
        a = raw["activation"]
        if not isinstance(a, str) or a.lower() not in _MEGATRON_ACTS:
            problems.append(f"field 'activation' = {a!r}: expected one of {', '.join(_MEGATRON_ACTS)}")
        else:
            act, implied = _MEGATRON_ACTS[a.lower()]
            if implied:
                gated = True
            if raw.get("swiglu") and act != "silu":
                problems.append(f"fields 'swiglu' and 'activation' = {a!r} contradict each other")
    elif raw.get("swiglu"):
        act = "silu"
    f["gated_mlp"], f["activation"] = gated, act
    for k in ("add_qkv_bias", "add_bias_linear", "moe_shared_expert_overlap"):
        f[k] = _bool(raw, k, problems) or None
    n_exp = _positive_int(raw, ("num_moe_experts", "num_experts"), problems, required=False) \
        if any(isinstance(raw.get(k), int) and raw.get(k) for k in ("num_moe_experts", "num_experts")) else None
    if n_exp:
        f["num_moe_experts"] = n_exp
        f["moe_router_topk"] = _positive_int(raw, ("moe_router_topk",), problems)
        f["moe_ffn_hidden_size"] = _positive_int(raw, ("moe_ffn_hidden_size",), problems, required=False) \
            or f["ffn_hidden_size"]   # Megatron: defaults to ffn_hidden_size
        f["moe_shared_expert_intermediate_size"] = _positive_int(raw, ("moe_shared_expert_intermediate_size",),
                                                                 problems, required=False)
        if raw.get("moe_layer_freq") is not None:
            f["moe_layer_freq"] = _moe_freq(raw["moe_layer_freq"], f["num_layers"], problems)
    else:
        for k in ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq"):
            if raw.get(k) is not None:
                problems.append(f"field '{k}' = {raw[k]!r}: an MoE field, but num_moe_experts is not set")
    f["mtp_num_layers"] = _positive_int(raw, ("mtp_num_layers",), problems, required=False) \
        if raw.get("mtp_num_layers") else None
    return f


_MEGATRON_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def _mla(raw: dict, problems: list[str], names: tuple, heads: int | None) -> dict:
    """MLA head sizes and ranks (names: the file's keys for q_lora_rank, kv_lora_rank, qk_head_dim,
    qk_pos_emb_head_dim, v_head_dim). q_lora_rank may be null (one q projection); the others must be given.
    Also the spec's num_query_groups (= heads) and kv_channels (= v_head_dim, linear_proj's input per head)."""
    out = {"multi_latent_attention": True}
    q, rest = names[0], names[1:]
    if q not in raw:
        problems.append(f"missing field '{q}': multi-latent attention needs it (null: a single q projection)")
    elif raw[q] is not None:
        out["q_lora_rank"] = _positive_int(raw, (q,), problems)
    for ours, theirs in zip(_MEGATRON_MLA_FIELDS[1:], rest):
        out[ours] = _positive_int(raw, (theirs,), problems)
    out["num_query_groups"], out["kv_channels"] = heads, out["v_head_dim"]
    return out


# --- Hugging Face families ---------------------------------------------------------------------
# model_type -> what its modelling code builds. gated: the MLP is gate/up/down (transformers'
# *MLP classes multiply act(gate) by up whatever hidden_act is); act: the default activation;
# moe: how the family names its experts; mla: multi-latent attention; qkv_bias: bias on q/k/v always.
HF_FAMILIES: dict[str, dict] = {
    "llama": {"gated": True}, "mistral": {"gated": True}, "qwen2": {"gated": True, "qkv_bias": True},
    "qwen3": {"gated": True}, "phi3": {"gated": True},
    "gemma": {"gated": True, "act": "gelu_tanh"}, "gemma2": {"gated": True, "act": "gelu_tanh"},
    "gemma3_text": {"gated": True, "act": "gelu_tanh",
                    "defaults": {"vocab_size": 262208, "head_dim": 256, "num_key_value_heads": 4}},
    "starcoder2": {"gated": False, "act": "gelu_tanh"}, "gpt_neox": {"gated": False, "act": "gelu"},
    "mixtral": {"gated": True, "moe": "mixtral"}, "qwen2_moe": {"gated": True, "moe": "qwen", "qkv_bias": True},
    "qwen3_moe": {"gated": True, "moe": "qwen"}, "gpt_oss": {"gated": True, "moe": "mixtral"},
    "llama4_text": {"gated": True, "moe": "llama4"},
    "deepseek_v2": {"gated": True, "moe": "deepseek", "mla": True},
    "deepseek_v3": {"gated": True, "moe": "deepseek", "mla": True},
}
HF_NESTED = {"gemma3": "gemma3_text", "llama4": "llama4_text"}   # multimodal configs: the text model's config
_HF_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_HF_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _hf_text(raw: dict, problems: list[str]) -> dict:
    """The text model's config of a multimodal one (Gemma 3, Llama 4), the outer tie flag kept."""
    mt = raw.get("model_type")
    if mt in HF_NESTED:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            problems.append(f"field 'text_config': model_type {mt!r} keeps its text model there; not found")
            return raw
        out = {**text, "model_type": text.get("model_type") or HF_NESTED[mt]}
        for k in ("tie_word_embeddings", "torch_dtype", "_name_or_path", "name", "workload", "seq_length",
                  "micro_batch_size", "dtype"):
            if k in raw and k not in out:
                out[k] = raw[k]
        return out
    return raw


def _read_hf(raw: dict, problems: list[str], bad: dict[str, str]) -> tuple[dict, dict]:
    raw = _typed(_hf_text(raw, problems), HF_FIELD_TYPES, problems, bad)
    mt = raw.get("model_type")
    fam = HF_FAMILIES.get(mt)
    if fam is None:
        what = "missing" if mt is None else f"{mt!r} is not a family tptune reads"
        problems.append(f"field 'model_type' {what}: whether its MLP is gated and how its experts and attention are "
                        f"laid out depend on the family; families read: {', '.join(sorted(HF_FAMILIES))} "
                        f"(multimodal: {', '.join(HF_NESTED)}). Otherwise describe the model in a Megatron-style "
                        "YAML (docs/models.md)")
        return raw, {}
    raw = {**fam.get("defaults", {}), **raw}
    hidden = _positive_int(raw, ("hidden_size",), problems)
    heads = _positive_int(raw, ("num_attention_heads",), problems)
    f = {"hidden_size": hidden, "num_attention_heads": heads, **_common(raw, problems, True)}
    moe = fam.get("moe")
    # the dense MLP's width: Llama 4 names it intermediate_size_mlp (intermediate_size is the experts')
    dense_key = "intermediate_size_mlp" if moe == "llama4" else "intermediate_size"
    f["ffn_hidden_size"] = _positive_int(raw, (dense_key,), problems)
    if not fam.get("mla"):
        bad = [k for k in _HF_MLA_FIELDS if raw.get(k) is not None]
        if bad:
            problems.append(f"field '{bad[0]}': multi-latent attention in a {mt!r} config, whose attention has no "
                            "latent projections in transformers; tptune reads MLA from deepseek_v2/deepseek_v3")
        f["num_query_groups"], f["kv_channels"] = _attention(raw, problems, hidden, heads,
                                                             ("num_key_value_heads",), ("head_dim",))
    else:
        f.update(_mla(raw, problems, _HF_MLA_FIELDS, heads))
    act_key = "hidden_activation" if mt.startswith("gemma") and raw.get("hidden_activation") else "hidden_act"
    act_raw = raw.get(act_key)
    if act_raw is None:
        act = fam.get("act", "silu")
    elif not isinstance(act_raw, str) or act_raw.lower() not in _HF_ACTS:
        problems.append(f"field '{act_key}' = {act_raw!r}: not an activation tptune reads "
                        f"({', '.join(_HF_ACTS)})")
        act = None
    else:
        act = _HF_ACTS[act_raw.lower()]
    gated = fam["gated"]
    f["gated_mlp"] = gated
    f["activation"] = act
    # biases: q/k/v (Qwen2 always; attention_bias elsewhere), and proj/fc1/fc2 (Megatron: one switch)
    attn_bias = _bool(raw, "attention_bias", problems) or False
    if mt in ("starcoder2",):
        attn_bias = mlp_bias = bool(raw.get("use_bias", True))
    elif mt == "gpt_neox":
        attn_bias = mlp_bias = bool(raw.get("attention_bias", True))
    elif mt == "gpt_oss":
        mlp_bias = True    # GptOssExperts carry gate_up_proj_bias / down_proj_bias
    else:
        mlp_bias = _bool(raw, "mlp_bias", problems) or False
    if attn_bias != mlp_bias and mt not in ("qwen2", "qwen2_moe"):
        problems.append(f"fields 'attention_bias' = {attn_bias} and 'mlp_bias' = {mlp_bias}: Megatron-core's "
                        "add_bias_linear is one switch for proj, fc1 and fc2; this bias layout cannot be built")
    f["add_qkv_bias"] = (fam.get("qkv_bias") or attn_bias) or None
    f["add_bias_linear"] = mlp_bias or None
    if moe:
        _hf_moe(raw, moe, mt, f, problems)
    else:
        bad = [k for k in _HF_EXPERT_FIELDS if isinstance(raw.get(k), int) and raw.get(k)]
        if bad:
            problems.append(f"field '{bad[0]}' = {raw[bad[0]]}: experts in a {mt!r} config, a dense family in "
                            "transformers; MoE families read: "
                            + ", ".join(k for k, v in HF_FAMILIES.items() if v.get("moe")))
    if mt == "deepseek_v3" and raw.get("num_nextn_predict_layers"):
        f["mtp_num_layers"] = _positive_int(raw, ("num_nextn_predict_layers",), problems)
    return raw, f


def _hf_moe(raw: dict, kind: str, mt: str, f: dict, problems: list[str]) -> None:
    layers = f.get("num_layers")
    experts_key = {"mixtral": "num_local_experts", "qwen": "num_experts", "llama4": "num_local_experts",
                   "deepseek": "n_routed_experts"}[kind]
    if not raw.get(experts_key):   # e.g. DeepSeek-V3 shapes without experts: a dense MLA model
        return
    f["num_moe_experts"] = _positive_int(raw, (experts_key,), problems)
    f["moe_router_topk"] = _positive_int(raw, ("num_experts_per_tok", "experts_per_token"), problems)
    if not layers:
        problems.append(f"missing field 'num_hidden_layers': an MoE model's dense and MoE layers are laid out "
                        "per layer")
        return
    if kind == "mixtral":
        f["moe_ffn_hidden_size"] = f["ffn_hidden_size"]
        pattern = [1] * layers
    elif kind == "qwen":
        f["moe_ffn_hidden_size"] = _positive_int(raw, ("moe_intermediate_size",), problems)
        step = _positive_int(raw, ("decoder_sparse_step",), problems, required=False) or 1
        only = raw.get("mlp_only_layers") or []
        pattern = [int(i not in only and (i + 1) % step == 0) for i in range(layers)]
        if mt == "qwen2_moe":
            f["moe_shared_expert_intermediate_size"] = _positive_int(raw, ("shared_expert_intermediate_size",),
                                                                     problems, required=False)
    elif kind == "llama4":
        f["moe_ffn_hidden_size"] = _positive_int(raw, ("intermediate_size",), problems)
        f["moe_shared_expert_intermediate_size"] = f["moe_ffn_hidden_size"]   # one shared expert, same width
        given = raw.get("moe_layers")
        step = _positive_int(raw, ("interleave_moe_layer_step",), problems, required=False) or 1
        moe_idx = set(given) if isinstance(given, list) and given else set(range(step - 1, layers, step))
        pattern = [int(i in moe_idx) for i in range(layers)]
    else:  # deepseek
        width = _positive_int(raw, ("moe_intermediate_size",), problems)
        f["moe_ffn_hidden_size"] = width
        shared = raw.get("n_shared_experts") or 0
        if shared and width:
            f["moe_shared_expert_intermediate_size"] = int(shared) * width
        k = raw.get("first_k_dense_replace") or 0
        freq = raw.get("moe_layer_freq") or 1
        pattern = [int(i >= k and i % freq == 0) for i in range(layers)]
    f["moe_layer_freq"] = None if all(pattern) else tuple(pattern)
    if not any(pattern):
        problems.append(f"field '{experts_key}' = {raw[experts_key]}: no layer is an MoE layer by this config's "
                        "layout fields")


def _check_moe(f: dict, problems: list[str]) -> None:
    k, n = f.get("moe_router_topk"), f.get("num_moe_experts")
    if k and n and k > n:
        problems.append(f"field 'moe_router_topk' = {k}: more than num_moe_experts={n}")


def load_model(path: str | Path, workload: dict | None = None) -> ModelConfig:
    """Read a model file (.yaml/.yml Megatron-style, or .json Hugging Face) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["file not found (expected a model .yaml or Hugging Face config.json)"])
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
                                      "expected a model .yaml or Hugging Face config.json"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read it ({exc.strerror})"]) from None
    if path.suffix != ".json":
        return parse_model(load_yaml(text, str(path)), str(path), workload)    # aliases bounded
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), [f"cannot parse: {str(exc).splitlines()[0]}"]) from None
    return parse_model(raw, str(path), workload)

"""Model shape and workload: read Megatron-style YAML or a Hugging Face config.json, validate.

The four linear ops only need a handful of numbers; everything else in those files is ignored.
The memory check (``tptune.memory``) also needs the layer count, the vocabulary size and whether
the output layer shares the embedding's weights. Those three fields are optional here: a file
without them still tunes the ops, and the memory check names the field it is missing.

Mixture-of-experts configs are refused (``EXPERT_FIELDS``): their expert MLPs would be read as one
dense MLP, with wrong fc1/fc2 shapes and a wrong memory estimate.

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

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

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
# Fields that mark a mixture-of-experts model (Mixtral, Qwen-MoE/Qwen3-MoE, DeepSeek, Megatron).
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "num_moe_experts", "moe_num_experts")
# Activations whose MLP is gated (fc1 produces gate and up halves): SwiGLU, GeGLU.
_GATED_ACTS = {"silu", "swiglu", "swish", "geglu", "gelu_glu", "reglu"}


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

    @property
    def q_size(self) -> int:
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
        spec = {k: v for k, v in asdict(self.model).items() if v is not None}
        return {"model": spec, "workload": self.workload.to_dict(), "source": self.source}

    def tp_problems(self, tp: int) -> list[str]:
        """What stops this model from running at tensor-parallel size ``tp`` (empty if nothing)."""
        m, w = self.model, self.workload
        checks = [
            ("num_attention_heads", m.num_attention_heads),
            ("num_query_groups", m.num_query_groups),
            ("ffn_hidden_size", m.ffn_hidden_size),
            ("tokens (seq_length*micro_batch_size)", w.tokens),
        ]
        return [f"TP={tp}: {name}={value} is not divisible by {tp}" for name, value in checks if value % tp]


# --- reading -----------------------------------------------------------------------------------

def _pick(raw: dict, names: tuple[str, ...]) -> tuple[str | None, Any]:
    for n in names:
        if n in raw and raw[n] is not None:
            return n, raw[n]
    return None, None


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
    import re

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
    None when the file gives none of them (both frameworks then tie; tptune.memory says so)."""
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
    Raises ConfigError listing every problem.
    """
    if not isinstance(raw, dict):
        raise ConfigError(source, [f"expected a mapping of model fields, got {type(raw).__name__}"])
    if isinstance(raw.get("model"), dict) and "hidden_size" not in raw:  # NeMo nests under model:
        raw = {**raw["model"], **{k: v for k, v in raw.items() if k != "model"}}
    problems: list[str] = []
    hf = is_hf_config(raw)
    hidden = _positive_int(raw, ("hidden_size",), problems)
    ffn = _positive_int(raw, ("intermediate_size", "ffn_hidden_size") if hf else ("ffn_hidden_size", "intermediate_size"), problems)
    heads = _positive_int(raw, ("num_attention_heads",), problems)
    groups = _positive_int(raw, ("num_key_value_heads", "num_query_groups") if hf else ("num_query_groups", "num_key_value_heads"),
                           problems, required=False)
    kv = _positive_int(raw, ("head_dim", "kv_channels") if hf else ("kv_channels", "head_dim"), problems, required=False)
    if groups is None and not any(k in raw for k in ("num_key_value_heads", "num_query_groups")):
        groups = heads  # plain multi-head attention
    if kv is None and not any(k in raw for k in ("head_dim", "kv_channels")) and hidden and heads:
        if hidden % heads:
            problems.append(f"field 'kv_channels' missing and hidden_size={hidden} is not divisible by "
                            f"num_attention_heads={heads}: give kv_channels explicitly")
        else:
            kv = hidden // heads
    if heads and groups and heads % groups:
        problems.append(f"field 'num_query_groups' = {groups}: must divide num_attention_heads={heads}")
    for key in EXPERT_FIELDS:
        n = raw.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            problems.append(f"field '{key}' = {n}: experts are not supported yet: this is a mixture-of-experts "
                            "model, and tptune would read its expert MLPs as one dense MLP (wrong fc1/fc2 shapes, "
                            "wrong memory estimate)")
    layers = _positive_int(raw, ("num_hidden_layers", "num_layers") if hf else ("num_layers", "num_hidden_layers"),
                           problems, required=False)
    vocab = _positive_int(raw, ("vocab_size", "padded_vocab_size"), problems, required=False)
    untie = _untie(raw, problems)

    if hf:
        act = raw.get("hidden_act", raw.get("hidden_activation", "silu"))
        gated = str(act).lower() in _GATED_ACTS
    else:
        flags = [k for k in ("gated_linear_unit", "swiglu", "gated_mlp") if k in raw]
        gated = False
        for k in flags:
            if not isinstance(raw[k], bool):
                problems.append(f"field '{k}' = {raw[k]!r}: expected true or false")
            else:
                gated = gated or raw[k]

    wl = dict(raw.get("workload") or {})
    for k in ("seq_length", "micro_batch_size", "dtype"):
        if k in raw and k not in wl:
            wl[k] = raw[k]
    if "params_dtype" in raw and "dtype" not in wl:
        wl["dtype"] = raw["params_dtype"]
    if raw.get("bf16") is True and "dtype" not in wl:
        wl["dtype"] = "bf16"
    if hf and "torch_dtype" in raw and "dtype" not in wl:
        wl["dtype"] = raw["torch_dtype"]
    wl.update({k: v for k, v in (workload or {}).items() if v is not None})
    unknown = set(wl) - {"seq_length", "micro_batch_size", "dtype", *FP8_FIELDS}
    if unknown:
        problems.append(f"workload: unknown field(s) {sorted(unknown)}; expected seq_length, micro_batch_size, "
                        f"dtype (fp8: also {', '.join(FP8_FIELDS)})")
    seq = _positive_int(wl, ("seq_length",), problems)
    mbs = _positive_int({"micro_batch_size": wl.get("micro_batch_size", 1)}, ("micro_batch_size",), problems)
    dtype = _dtype(wl.get("dtype", "bf16"), "dtype", problems)
    recipe, fp8_format, fp8_emulation = _fp8_fields(wl, dtype, problems)

    name = raw.get("name") or raw.get("_name_or_path") or Path(source).stem
    if problems:
        raise ConfigError(source, problems)
    return ModelConfig(
        model=ModelSpec(str(name), hidden, ffn, heads, groups, kv, bool(gated), layers, vocab, untie),
        workload=Workload(seq, mbs, dtype, recipe, fp8_format, fp8_emulation),
        source=source,
    )


def load_model(path: str | Path, workload: dict | None = None) -> ModelConfig:
    """Read a model file (.yaml/.yml Megatron-style, or .json Hugging Face) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["file not found (expected a model .yaml or Hugging Face config.json)"])
    text = path.read_text()
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), [f"cannot parse: {str(exc).splitlines()[0]}"]) from None
    return parse_model(raw, str(path), workload)

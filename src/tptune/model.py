"""Model shape and workload: read Megatron-style YAML or a Hugging Face config.json, validate.

The four linear ops only need a handful of numbers; everything else in those files is ignored.
The memory check (``tptune.memory``) also needs the layer count, the vocabulary size and whether
the output layer shares the embedding's weights. Those three fields are optional here: a file
without them still tunes the ops, and the memory check names the field it is missing.

Mixture-of-experts configs are refused (``EXPERT_FIELDS``): their expert MLPs would be read as one
dense MLP, with wrong fc1/fc2 shapes and a wrong memory estimate.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
}
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

    @property
    def tokens(self) -> int:
        return self.seq_length * self.micro_batch_size

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class ModelConfig:
    model: ModelSpec
    workload: Workload
    source: str = field(default="<dict>", compare=False)

    def to_dict(self) -> dict[str, Any]:
        # Optional fields the file did not give are left out (the dict of such a file is unchanged).
        spec = {k: v for k, v in asdict(self.model).items() if v is not None}
        return {"model": spec, "workload": asdict(self.workload), "source": self.source}

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
    if not isinstance(value, str) or value.lower() not in _DTYPE_ALIASES:
        problems.append(f"field '{key}' = {value!r}: expected one of bf16, fp16, fp32")
        return None
    return _DTYPE_ALIASES[value.lower()]


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
    unknown = set(wl) - {"seq_length", "micro_batch_size", "dtype"}
    if unknown:
        problems.append(f"workload: unknown field(s) {sorted(unknown)}; expected seq_length, micro_batch_size, dtype")
    seq = _positive_int(wl, ("seq_length",), problems)
    mbs = _positive_int({"micro_batch_size": wl.get("micro_batch_size", 1)}, ("micro_batch_size",), problems)
    dtype = _dtype(wl.get("dtype", "bf16"), "dtype", problems)

    name = raw.get("name") or raw.get("_name_or_path") or Path(source).stem
    if problems:
        raise ConfigError(source, problems)
    return ModelConfig(
        model=ModelSpec(str(name), hidden, ffn, heads, groups, kv, bool(gated), layers, vocab, untie),
        workload=Workload(seq, mbs, dtype),
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

"""What each framework needs to train packed micro-batches of exactly T tokens with the tuned overlap.

Values only (``FrameworkSettings``: command-line arguments or config overrides, whether the framework can hold
the token count fixed as it is, and what it takes otherwise); the caller writes them. ``switches`` is the
set's Megatron-LM switch line (``megatron_flags.txt``: ``--tp-comm-overlap`` and the switches that turn parts
of it off) and ``transformer_overrides`` the same as TransformerConfig fields
(``transformer_config_overrides.yaml``); ``cfg_path`` the set's ``tp_comm_overlap_cfg.yaml``.

- **Megatron-LM** (SFT-style packed data): ``--seq-length T --micro-batch-size 1 --sequence-parallel`` and the
  set: ``_initialize_tp_communicators`` sizes the buffers for ``seq_length x micro_batch_size``.
- **Megatron-RL**: the same with ``--rl-use-sequence-packing``: ``pack_all_trajectories(bin_size=
  args.seq_length)`` already pads every bin to T, for training and for the log-prob passes alike: ready.
- **slime**: Megatron's arguments plus ``--use-dynamic-batch-size --max-tokens-per-gpu T
  --log-probs-max-tokens-per-gpu T --data-pad-size-multiplier T/TP``: its first-fit keeps every micro-batch at
  most T tokens, and padding to a multiple of TP x T/TP = T pads each to exactly T (a sequence longer than T
  would pad to 2 T: none may be). Context parallelism 1. Ready, with these settings.
- **veRL** (Megatron engine): Hydra overrides (``override_transformer_config`` and the token budgets). Not
  ready: veRL never calls TE's ``initialize_ub`` (veRL #5663), so ``tp_comm_overlap`` alone fails at the first
  overlapped GEMM; and its dynamic batch size partitions by workload (Karmarkar-Karp), so a micro-batch's
  token count varies and overshoots its budget (PR #7272): no budget makes it fixed. It takes a patch
  (``VERL_NEEDS``).

The option names are checked (``option_problems``) against snapshots of each framework's own parser or config
(``data/megatron_lm_args.txt``: Megatron-core 0.19.2's parser, slime's on top of it in ``data/slime_args.txt``,
veRL's config keys in ``data/verl_megatron_config_keys.txt``, TransformerConfig's fields in
``data/megatron_config_fields.yaml``), none of which installs cheaply on a CPU; scripts/snapshot_rl_options.py
writes the veRL and slime snapshots from their sources at the commits they name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from tptune.packing.rules import MEGATRON_RL_MAX_SEQS

DATA = Path(__file__).resolve().parents[1] / "data"
FRAMEWORKS = ("megatron_lm", "megatron_rl", "slime", "verl")
VERL_ACTOR = "actor_rollout_ref.actor"
VERL_NEEDS = (
    "call transformer_engine.pytorch.module.base.initialize_ub(shape=[T, hidden_size], tp_size=TP, "
    "ub_cfgs=<tp_comm_overlap_cfg.yaml>, quantization_modes=[FP8 or NONE]) in the Megatron worker after model-"
    "parallel initialization and before the model is built (veRL never does: veRL #5663, TE #3564)",
    "replace rearrange_micro_batches' Karmarkar-Karp partition (by workload, whose micro-batches vary and overshoot "
    "max_token_len: PR #7272) with fill-to-capacity bins of at most T tokens (Megatron-RL's next-fit decreasing) "
    "for the update and the log-prob passes, and pad each micro-batch's packed sequence to exactly T in "
    "preprocess_packed_seqs (one padding segment at the end, as Megatron-RL's bins), keeping the micro-batch count "
    "equal over data-parallel ranks",
)


@dataclass(frozen=True)
class FrameworkSettings:
    framework: str
    capacity: int
    args: tuple[str, ...] = ()                       # command-line arguments (Megatron-LM, Megatron-RL, slime)
    overrides: dict[str, Any] = field(default_factory=dict)   # Hydra overrides, dotted key -> value (veRL)
    ready: bool = True                               # holds the token count at T with these settings alone
    needs: tuple[str, ...] = ()                      # what it takes where not ready

    def command_line(self) -> str:
        if self.args:
            return " ".join(self.args)
        return " ".join(f"{k}={_hydra(v)}" for k, v in self.overrides.items())

    def to_dict(self) -> dict:
        return {"framework": self.framework, "capacity": self.capacity, "args": list(self.args),
                "overrides": dict(self.overrides), "ready": self.ready, "needs": list(self.needs),
                "command_line": self.command_line()}


def _hydra(v: Any) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def _overlap_args(cfg_path: str, switches: list[str] | None) -> list[str]:
    args = ["--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-cfg", str(cfg_path)]
    extra = [s for s in (switches or []) if s not in ("--tp-comm-overlap", "--sequence-parallel")]
    i = 0
    while i < len(extra):                 # the set's own --tp-comm-overlap-cfg <path> is replaced by cfg_path
        if extra[i] == "--tp-comm-overlap-cfg":
            del extra[i:i + 2]
            continue
        i += 1
    return args + extra


def megatron_lm(capacity: int, cfg_path: str, switches: list[str] | None = None) -> FrameworkSettings:
    return FrameworkSettings("megatron_lm", capacity, tuple(
        ["--seq-length", str(capacity), "--micro-batch-size", "1"] + _overlap_args(cfg_path, switches)))


def megatron_rl(capacity: int, cfg_path: str, switches: list[str] | None = None,
                max_sequences_per_bin: int = MEGATRON_RL_MAX_SEQS) -> FrameworkSettings:
    return FrameworkSettings("megatron_rl", capacity, tuple(
        ["--rl-use-sequence-packing", "--rl-sequence-packing-max-sequences-per-bin", str(max_sequences_per_bin),
         "--seq-length", str(capacity), "--micro-batch-size", "1"] + _overlap_args(cfg_path, switches)))


def slime(capacity: int, tp: int, cfg_path: str, switches: list[str] | None = None) -> FrameworkSettings:
    if capacity % tp:
        raise ValueError(f"T = {capacity} is not a multiple of TP {tp}")
    return FrameworkSettings("slime", capacity, tuple(
        ["--seq-length", str(capacity), "--micro-batch-size", "1", "--use-dynamic-batch-size",
         "--max-tokens-per-gpu", str(capacity), "--log-probs-max-tokens-per-gpu", str(capacity),
         "--data-pad-size-multiplier", str(capacity // tp), "--context-parallel-size", "1"]
        + _overlap_args(cfg_path, switches)))


def verl(capacity: int, tp: int, transformer_overrides: dict | None = None) -> FrameworkSettings:
    over = {"tp_comm_overlap": True, **(transformer_overrides or {})}
    o: dict[str, Any] = {
        f"{VERL_ACTOR}.megatron.tensor_model_parallel_size": tp,
        f"{VERL_ACTOR}.megatron.sequence_parallel": True,
        f"{VERL_ACTOR}.megatron.context_parallel_size": 1,
        f"{VERL_ACTOR}.megatron.use_remove_padding": True,
        f"{VERL_ACTOR}.use_dynamic_bsz": True,
        f"{VERL_ACTOR}.ppo_max_token_len_per_gpu": capacity,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": capacity,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": capacity,
    }
    o.update({f"{VERL_ACTOR}.megatron.override_transformer_config.{k}": v for k, v in over.items()})
    return FrameworkSettings("verl", capacity, overrides=o, ready=False, needs=VERL_NEEDS)


def all_settings(capacity: int, tp: int, cfg_path: str, switches: list[str] | None = None,
                 transformer_overrides: dict | None = None) -> list[FrameworkSettings]:
    """Every framework's settings for the overlap set at T."""
    return [megatron_lm(capacity, cfg_path, switches), megatron_rl(capacity, cfg_path, switches),
            slime(capacity, tp, cfg_path, switches), verl(capacity, tp, transformer_overrides)]


# --- checked against the frameworks' own option names ----------------------------------------------------------

@lru_cache(maxsize=None)
def _names(file: str) -> dict[str, str]:
    out = {}
    for line in (DATA / file).read_text().splitlines():
        if line and not line.startswith("#"):
            name, *kind = line.split()
            out[name] = kind[0] if kind else "?"
    return out


@lru_cache(maxsize=None)
def _transformer_fields() -> frozenset[str]:
    return frozenset(yaml.safe_load((DATA / "megatron_config_fields.yaml").read_text())["fields"])


def option_problems(s: FrameworkSettings) -> list[str]:
    """The options of ``s`` its framework does not know, or a switch given a value / a value option none."""
    out = []
    if s.framework == "verl":
        keys = _names("verl_megatron_config_keys.txt")
        prefix = f"{VERL_ACTOR}.megatron.override_transformer_config."
        for k in s.overrides:
            if k.startswith(prefix):
                if k[len(prefix):] not in _transformer_fields():
                    out.append(f"veRL {k}: {k[len(prefix):]} is not a TransformerConfig field")
            elif k not in keys:
                out.append(f"veRL {k}: not a key of its Megatron trainer config")
        return out
    known = dict(_names("megatron_lm_args.txt"))
    if s.framework == "slime":
        known.update({k: "?" for k in _names("slime_args.txt")})
    args = list(s.args)
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        if a not in known:
            out.append(f"{s.framework} {a}: not an option of its parser")
            continue
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if known[a] == "switch" and takes_value:
            out.append(f"{s.framework} {a}: a switch, given {args[i + 1]!r}")
        if known[a] == "value" and not takes_value:
            out.append(f"{s.framework} {a}: takes a value, given none")
    return out

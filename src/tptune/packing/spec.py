"""``workload.packing`` of a run config, typed and checked (``tptune validate`` runs ``config_problems``).

    workload:
      packing:
        lengths: config/packing/rl-bimodal.txt   # or {file, column} / {file, field} / {histogram: ...} (lengths.py)
        rule: verl                  # the framework's native batching: fill (Megatron-RL) | verl | slime
        max_token_len: 16384        # its per-GPU token budget: veRL ppo_max_token_len_per_gpu, slime
                                    # --max-tokens-per-gpu, Megatron-RL --seq-length (its bins' capacity today)
        seqs_per_step: 64           # sequences one GPU trains per optimizer step
        forward_passes: 2           # forward-only passes per step over the same micro-batches (log-prob + ref)
        capacities: [8192, 16384]   # optional: the capacities T to measure (default: capacity.candidate_capacities)
        seed: 0                     # optional: the steps' draw

The schema (data/config.schema.yaml) checks the types; ``config_problems`` what needs the lengths: that they
read (lengths.load_lengths), that every listed capacity suits every TP of ``tp_sizes`` (a multiple of TP, FP8:
of 16 TP) and holds the longest sequence, that the default candidates exist (the longest sequence within twice
max_token_len), veRL's own assertion (max_token_len >= the longest sequence) and, for ``rule: fill``, that the
longest sequence fits a bin of max_token_len. ``native_steps`` and ``fill_steps`` draw the steps of setups (a)
and (b)/(c) of packing.decide from one seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tptune.errors import ConfigError
from tptune.packing.capacity import candidate_capacities, capacity_problems
from tptune.packing.lengths import load_lengths
from tptune.packing.rules import Step, fill_packer, pack_steps

KEYS = ("lengths", "rule", "max_token_len", "seqs_per_step", "forward_passes", "capacities", "seed")
REQUIRED = ("lengths", "rule", "max_token_len", "seqs_per_step")


@dataclass(frozen=True)
class PackingSpec:
    lengths: object
    rule: str
    max_token_len: int
    seqs_per_step: int
    forward_passes: int = 0
    capacities: tuple[int, ...] | None = None
    seed: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "PackingSpec":
        caps = d.get("capacities")
        return cls(d["lengths"], d["rule"], int(d["max_token_len"]), int(d["seqs_per_step"]),
                   int(d.get("forward_passes", 0)), tuple(caps) if caps else None, int(d.get("seed", 0)))

    @classmethod
    def from_config(cls, config: dict) -> "PackingSpec | None":
        """The run config's ``workload.packing`` (None where it has none)."""
        d = (config.get("workload") or {}).get("packing")
        return cls.from_dict(d) if d else None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in KEYS}
        d["capacities"] = list(self.capacities) if self.capacities else None
        return {k: v for k, v in d.items() if v is not None}

    def load(self, base_dir: str | Path = ".") -> np.ndarray:
        return load_lengths(self.to_dict(), Path(base_dir))

    def capacities_for(self, lengths: np.ndarray, tp: int, fp8: bool, recipe: str | None = None) -> list[int]:
        return candidate_capacities(lengths, self.max_token_len, tp, fp8,
                                    list(self.capacities) if self.capacities else None, recipe)

    def native_steps(self, lengths: np.ndarray, tp: int, fp8: bool = False, steps: int | None = None) -> list[Step]:
        """The steps under the framework's own batching, setup (a): veRL's or slime's micro-batches with their
        own padding, or for ``rule: fill`` (Megatron-RL) its bins at its ``--seq-length``, ``max_token_len``."""
        if self.rule == "fill":
            return pack_steps(lengths, "fill", seqs_per_step=self.seqs_per_step, rng=self.seed, steps=steps,
                              capacity=self.max_token_len)
        return pack_steps(lengths, self.rule, seqs_per_step=self.seqs_per_step, rng=self.seed, steps=steps,
                          max_token_len=self.max_token_len, tp=tp, fp8=fp8)

    def fill_steps(self, lengths: np.ndarray, capacity: int, steps: int | None = None) -> list[Step]:
        """The same steps in fill-to-capacity bins of ``capacity``, setups (b) and (c): the packer the framework's
        users would run at T (rules.fill_packer: slime's own first-fit for slime, Megatron-RL's otherwise)."""
        return pack_steps(lengths, "fill", seqs_per_step=self.seqs_per_step, rng=self.seed, steps=steps,
                          capacity=capacity, packer=fill_packer(self.rule))


def config_problems(packing: dict, base_dir: str | Path, tp_sizes: list[int], fp8: bool = False,
                    recipe: str | None = None) -> list[str]:
    """What is wrong with a ``workload.packing`` that passed the schema (module doc); empty: nothing."""
    missing = [k for k in REQUIRED if k not in packing]
    if missing:
        return [f"field 'workload.packing.{k}': required but missing" for k in missing]
    try:
        lengths = load_lengths(packing, Path(base_dir))
    except ConfigError as exc:
        return list(exc.problems)
    longest = int(lengths.max())
    out: list[str] = []
    caps = packing.get("capacities")
    for tp in sorted(set(tp_sizes)):
        if caps is not None:
            out += [p + (f" (at TP {tp} of tp_sizes)" if len(tp_sizes) > 1 else "")
                    for p in capacity_problems(caps, longest, tp, fp8, recipe)]
        else:
            try:
                candidate_capacities(lengths, packing["max_token_len"], tp, fp8, None, recipe)
            except ConfigError as exc:
                out += [f"field 'workload.packing.capacities': {p}" for p in exc.problems]
    if packing["rule"] == "verl" and packing["max_token_len"] < longest:
        out.append(f"field 'workload.packing.max_token_len' = {packing['max_token_len']}: veRL asserts max_token_len "
                   f">= the longest sequence ({longest} tokens)")
    if packing["rule"] == "fill" and packing["max_token_len"] < longest:
        out.append(f"field 'workload.packing.max_token_len' = {packing['max_token_len']}: rule fill packs into bins "
                   f"of max_token_len (Megatron-RL's --seq-length), which the longest sequence ({longest} tokens) "
                   "does not fit")
    return list(dict.fromkeys(out))

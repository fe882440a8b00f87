"""The confirm stage on packed data (issue 53): every arm trains the same packed THD micro-batches, drawn from the
user's rollout lengths (the run config's ``workload.packing``) and filled to one capacity T by the packer the
framework's users would run at T (packing.spec.PackingSpec.fill_steps), each padded to T: Megatron's
``--seq-length T --micro-batch-size 1``, userbuffers sized for T.

T: ``--capacity``, else the capacity packing.json decided on. Every micro-batch of a launch is its own bin (none
is reused: a reused bin is memorised and its loss falls for that reason alone), the same bins in every launch.
Every arm computes on the same tokens, so the real tokens per second of two arms stand in the inverse ratio of
their iteration times; confirm.json's ``packed`` gives the bins' real tokens and padding and each arm's real tokens
per second.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tptune.errors import ConfigError
from tptune.packing.spec import PackingSpec
from tptune.records.run_dir import RunDir


def packing_spec(run: RunDir) -> tuple[PackingSpec, Path]:
    """The run config's ``workload.packing`` and the folder its lengths are relative to."""
    path = run.root / "config.json"
    if not path.is_file():
        raise ConfigError(str(path), ["no such file: the resolved run config (its workload.packing)"])
    cfg = json.loads(path.read_text())
    spec = PackingSpec.from_config(cfg)
    if spec is None:
        raise ConfigError(str(path), ["field 'workload.packing': absent, so there are no rollout lengths to pack "
                                      "(docs/packing.md)"])
    return spec, Path(cfg.get("_base_dir") or ".")


def decided_capacity(run: RunDir) -> int | None:
    """The capacity T packing.json decided on (None without one)."""
    p = run.root / "packing.json"
    if not p.is_file():
        return None
    rec = json.loads(p.read_text())
    for d in (rec, rec.get("decision") or {}):
        if isinstance(d, dict) and isinstance(d.get("capacity"), int):
            return d["capacity"]
    return None


def draw_bins(spec: PackingSpec, lengths, capacity: int, count: int) -> list[list[int]]:
    """``count`` bins of whole sequences for capacity T, the steps' fill bins in order (as many steps as needed)."""
    bins: list[list[int]] = []
    steps = 1
    while len(bins) < count:
        bins = [list(mb.lengths) for st in spec.fill_steps(lengths, capacity, steps=steps) for mb in st.micro_batches]
        if steps > 10_000:
            raise ConfigError("workload.packing", [f"{count} bins of capacity {capacity} need more than 10000 steps"])
        steps *= 2
    return bins[:count]


def packed_plan(run: RunDir, mc, *, capacity: int | None, iters: int, micro_batches: int, tp: int) -> tuple:
    """(the model config at seq T and micro-batch 1, the bins file written under confirm/, its summary)."""
    spec, base = packing_spec(run)
    lengths = spec.load(base)
    t = capacity or decided_capacity(run)
    if t is None:
        from tptune.confirm.available import ConfirmUnavailable
        raise ConfirmUnavailable(f"the packed loop needs a capacity T and {run.root / 'packing.json'} decided none "
                                 "(give --capacity T)")
    if t % tp or t < int(lengths.max()):
        raise ConfigError("--capacity", [f"{t}: expected a multiple of TP {tp} that holds the longest sequence "
                                         f"({int(lengths.max())} tokens)"])
    bins = draw_bins(spec, lengths, t, iters * micro_batches)
    real = [sum(b) for b in bins]
    path = run.confirm_dir / "packed_bins.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"capacity": t, "bins": bins}))
    summary = {"capacity": t, "rule": spec.rule, "packer": "fill", "bins": len(bins),
               "real_tokens_per_iteration": round(sum(real) / iters, 1),
               "padding_share": round(1 - sum(real) / (t * len(bins)), 4), "bins_file": str(path.relative_to(run.root))}
    mc_t = replace(mc, workload=replace(mc.workload, seq_length=t, micro_batch_size=1))
    return mc_t, path, summary


def tokens_per_second(summary: dict, launches: list[dict]) -> dict[str, float]:
    """Each arm's real tokens per second: real tokens an iteration over its median iteration time."""
    out = {}
    for name in sorted({x["setting"] for x in launches}):
        ms = sorted(x.get("iteration_ms") or x.get("median_ms") for x in launches
                    if x["setting"] == name and x["status"] == "ok" and (x.get("iteration_ms") or x.get("median_ms")))
        if ms:
            out[name] = round(summary["real_tokens_per_iteration"] / (ms[len(ms) // 2] / 1e3), 1)
    return out

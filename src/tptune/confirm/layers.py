"""How many layers a confirm trains: as many as fit one GPU at the model TP (tptune.model.memory's estimate of
Megatron training with the whole model state on every rank: one data-parallel replica, no distributed
optimizer, no pipeline), at least 2 and at most ``max_layers``, which keeps the stage's time down (every layer
adds to every iteration of every launch); and how much of the iteration those layers are."""
from __future__ import annotations

import math
from dataclasses import replace

from tptune.model.memory import GIB, estimate
from tptune.model.spec import ModelConfig
from tptune.records.measured_point import decided_points

MIN_LAYERS = 2


def with_layers(mc: ModelConfig, n: int) -> ModelConfig:
    """The model cut to ``n`` layers, MoE layers laid out as the layer stage's block (ModelSpec.block_pattern)."""
    m = mc.model
    kw = {"num_layers": n}
    if m.is_moe:
        kw["moe_layer_freq"] = tuple(int(x) for x in m.block_pattern(n))
    if m.mtp_num_layers:
        kw["mtp_num_layers"] = None
    return replace(mc, model=replace(m, **kw))


def layer_memory(mc: ModelConfig, n: int, tp: int, gpu_memory: int | None) -> dict:
    return estimate(with_layers(mc, n), tp, {"pp": 1, "dp": 1, "distributed_optimizer": False},
                    gpu_memory, gpus_per_node=tp)


def choose_layers(mc: ModelConfig, tp: int, *, requested: int | None, max_layers: int,
                  gpu_memory: int | None) -> tuple[int, str]:
    """(layers, why)."""
    if requested is not None:
        if requested < MIN_LAYERS:
            raise ValueError(f"--layers {requested}: at least {MIN_LAYERS}")
        est = layer_memory(mc, requested, tp, gpu_memory)
        return requested, f"{requested} as asked (--layers); memory estimate: {est['why']}"
    if gpu_memory is None:
        return MIN_LAYERS, (f"{MIN_LAYERS}, the fewest: this machine's GPU memory is unknown, so the estimate "
                            "cannot say how many fit")
    fit = [n for n in range(MIN_LAYERS, max_layers + 1) if layer_memory(mc, n, tp, gpu_memory)["fits"]]
    if not fit:
        est = layer_memory(mc, MIN_LAYERS, tp, gpu_memory)
        return MIN_LAYERS, f"{MIN_LAYERS}, the fewest, though the estimate says they do not fit ({est['why']})"
    n = fit[-1]
    est = layer_memory(mc, n, tp, gpu_memory)
    if n == max_layers:
        more = layer_memory(mc, max_layers + 1, tp, gpu_memory)
        cap = "more would fit" if more["fits"] else "no more fit"
        return n, (f"{n}: the cap (confirm max_layers; each layer lengthens every launch), {cap}; "
                   f"{est['total'] / GIB:.1f} GiB of {est['usable'] / GIB:.1f} GiB usable a GPU")
    return n, f"{n}: the most that fit one GPU ({est['total'] / GIB:.1f} GiB of {est['usable'] / GIB:.1f} GiB usable)"


def layers_share(layer_record: dict | None, layers: int, micro_batches: int, iteration_ms: float | None) -> dict | None:
    """The share of the set's iteration its ``layers`` transformer layers take, from the layer stage's block time
    of the tuned combination (fwd+bwd of ``num_layers`` layers, one micro-batch): block_ms / num_layers x layers x
    micro_batches / iteration_ms. The rest is the embedding, the output layer, the loss and the optimizer step,
    which TP overlap does not touch. None without a layer record or an iteration time."""
    if not layer_record or not iteration_ms:
        return None
    tuned = next((r for r in layer_record.get("settings", []) if r.get("case") == layer_record.get("tuned")), None)
    if not tuned or not tuned.get("median_ms") or not layer_record.get("num_layers"):
        return None
    per_layer = tuned["median_ms"] / layer_record["num_layers"]
    share = per_layer * layers * micro_batches / iteration_ms
    return {"share": round(share, 3), "block_ms_per_layer": round(per_layer, 3), "iteration_ms": iteration_ms,
            "from": f"layer/tp{layer_record.get('tp')}.json {layer_record.get('tuned')}"}


def ops_share(decisions: dict | None, tp: int, layers: int, micro_batches: int,
              iteration_ms: float | None) -> dict | None:
    """The share of the set's iteration the four tuned ops take (their GEMMs with the TP communication the set
    overlaps: what the emitted files change), from the TP point's chosen setting of each op (decisions.json
    ``ops.<op>.points.<tp>.best``, fwd+bwd, one layer, one micro-batch) x layers x micro_batches over the
    iteration time. None where an op has no TP point at ``tp`` or there is no iteration time."""
    if not decisions or not iteration_ms:
        return None
    per_op = {}
    for op in decisions.get("ops") or {}:
        best = decided_points(decisions, op, tp).get("best")
        ms = best.median() if best is not None else math.inf
        if not math.isfinite(ms):
            return None
        per_op[op] = round(ms, 4)
    if not per_op:
        return None
    per_layer = sum(per_op.values())
    return {"share": round(per_layer * layers * micro_batches / iteration_ms, 3), "ops_ms_per_layer": round(per_layer, 3),
            "ops_ms": per_op, "iteration_ms": iteration_ms, "from": f"decisions.json ops.*.points.{tp}.best"}


def projection(ratio: dict | None, share: dict | None, layers: int, full_layers: int | None,
               ref_ms: float | None, set_ms: float | None) -> dict | None:
    """A PROJECTION, not a measurement: the ratio ``a/b`` carried to the model's full depth. The part of the
    iteration outside the transformer layers (``rest``: the set's iteration x (1 - the layers' share)) is taken
    as the same for every arm (TP overlap does not touch the embedding, the output layer, the loss or the
    optimizer step); each arm's per-layer time is (its iteration - rest) / ``layers``; the full model's
    iteration is rest + ``full_layers`` x that. Applied to the ratio and to its interval's ends. None without a
    share, a deeper model or times."""
    if not ratio or not share or not full_layers or full_layers <= layers or not ref_ms or not set_ms:
        return None
    rest = set_ms * (1 - share["share"])
    if rest <= 0 or ref_ms <= rest:
        return None

    def carry(r: float) -> float:
        a = rest + full_layers * (r * ref_ms - rest) / layers
        b = rest + full_layers * (ref_ms - rest) / layers
        return round(a / b, 4)

    out = {"ratio": carry(ratio["ratio"]), "layers": full_layers, "measured_layers": layers,
           "kind": "projection", "rest_ms": round(rest, 2)}
    if ratio.get("lo") is not None and ratio.get("hi") is not None and math.isfinite(ratio["hi"]):
        out.update(lo=carry(ratio["lo"]), hi=carry(ratio["hi"]))
    return out

"""Errors of a setting's tensors against the higher-precision no-overlap reference, over all TP ranks.

stats.numerics holds the rule; this module measures what it judges: per tensor the relative L2 error
(sqrt of the summed squared differences over the summed squared reference, each summed over the ranks'
shards) and the largest |diff| (over ranks), and the reference's largest |value|. Sums accumulate in
float64, a chunk at a time, so a weight gradient of hundreds of millions of elements costs no float64
copy of itself.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from tptune.stats.numerics import HIGHER, judge

TORCH_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}
HIGHER_DTYPE = {"fp32": torch.float32, "fp64": torch.float64}
_CHUNK = 1 << 24


def higher_dtype(precision: str) -> torch.dtype:
    """The reference's dtype for a measured precision (bf16/fp16/fp8 -> fp32, fp32 -> fp64)."""
    if precision not in HIGHER:
        raise ValueError(f"no higher-precision reference for {precision!r}")
    return HIGHER_DTYPE[HIGHER[precision]]


def _sums(t: torch.Tensor, r: torch.Tensor) -> tuple[float, float, float, float]:
    """(sum (t-r)^2, sum r^2, max |t-r|, max |r|) of two tensors of one shape, chunk by chunk."""
    t, r = t.detach().reshape(-1), r.detach().reshape(-1)
    dt = torch.promote_types(torch.promote_types(t.dtype, r.dtype), torch.float32)
    d2 = r2 = 0.0
    dmax = rmax = 0.0
    for i in range(0, t.numel(), _CHUNK):
        rc = r[i:i + _CHUNK].to(device=t.device, dtype=dt)
        dc = t[i:i + _CHUNK].to(dt) - rc
        d2 += float(dc.double().pow(2).sum())
        r2 += float(rc.double().pow(2).sum())
        dmax = max(dmax, float(dc.abs().max()))
        rmax = max(rmax, float(rc.abs().max()))
    return d2, r2, dmax, rmax


ROUTED_EXPERT = re.compile(r"^(.*\.experts\.linear_fc[12]\.weight)\d+$")


def judged_as(name: str) -> str:
    """The tensor a gradient is judged in: a routed expert's weight gradient together with the other
    routed experts' of its layer and linear (``...experts.linear_fc1.weight*``), every other tensor alone.
    A router's top-k is discontinuous: a token near a tie goes to another expert when its input differs
    by rounding, moving its gradient from one expert to another, so one expert's gradient measures routing
    flips, not the overlap (Qwen3-30B-A3B at TP 2: no overlap against a second no-overlap build erred 7.4x
    on one expert's fc2), while the layer's experts together keep every token's contribution."""
    m = ROUTED_EXPERT.match(name)
    return f"{m[1]}*" if m else name


def errors(test: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], group, device) -> dict[str, dict]:
    """{tensor: {"rel_l2", "max_abs", "ref_absmax"}} over every rank of ``group`` (a collective: every
    rank calls it with the same names), routed experts' gradients pooled per layer (judged_as)."""
    names = sorted(test)
    missing = set(names) ^ set(ref)
    if missing:
        raise ValueError(f"numerics: the reference and the setting hold different tensors: {sorted(missing)}")
    sums, maxes = [], []
    for n in names:
        if tuple(test[n].shape) != tuple(ref[n].shape):
            raise ValueError(f"numerics: {n} has shape {tuple(test[n].shape)}, its reference {tuple(ref[n].shape)}")
        d2, r2, dmax, rmax = _sums(test[n], ref[n])
        sums += [d2, r2]
        maxes += [dmax, rmax]
    s = torch.tensor(sums, dtype=torch.float64, device=device)
    m = torch.tensor(maxes, dtype=torch.float64, device=device)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s, m = s.tolist(), m.tolist()
    pooled: dict[str, list] = {}
    for i, n in enumerate(names):
        acc = pooled.setdefault(judged_as(n), [0.0, 0.0, 0.0, 0.0])
        acc[0] += s[2 * i]
        acc[1] += s[2 * i + 1]
        acc[2] = max(acc[2], m[2 * i])
        acc[3] = max(acc[3], m[2 * i + 1])
    return {n: {"rel_l2": (d2 / r2) ** 0.5 if r2 > 0 else (0.0 if d2 == 0 else float("inf")),
                "max_abs": dmax, "ref_absmax": rmax} for n, (d2, r2, dmax, rmax) in pooled.items()}


def verdict(test: dict, baseline_errs: dict, hp_ref: dict, group, device, precision: str, *,
            reference: str) -> dict:
    """The rule of stats.numerics on ``test`` (the measured setting's tensors), given the same-precision
    no-overlap block's errors against ``hp_ref`` (the higher-precision no-overlap block's tensors)."""
    res = judge(errors(test, hp_ref, group, device), baseline_errs, precision)
    res["reference_block"] = reference
    return res


def finite(test: dict[str, torch.Tensor], group, device) -> bool:
    """Every tensor finite on every rank of ``group``."""
    ok = all(bool(torch.isfinite(t).all()) for t in test.values())
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item() == 0.0)

"""The numerics rule: a setting errs like no overlap does, against a higher-precision block.

Two answers of the same precision whose reduction orders differ (overlap against no overlap) differ by
rounding alone, and at TP 4 that alone exceeds TE's pairwise tolerances (issue 33: every overlapped
block setting, NVIDIA's TP 4 preset included, "failed" TE's criterion while each erred exactly like bf16
no overlap against an fp32 block). So each setting is measured against the same block run in a higher
precision without overlap (bf16/fp16/FP8 against fp32, fp32 against fp64), from the same weights, input
and output gradient, and so is the same-precision no-overlap block (the baseline). A tensor passes when

    rel_l2(setting)   <= FACTOR_L2  * max(rel_l2(baseline), u)
    max_abs(setting)  <= FACTOR_MAX * max(max_abs(baseline), u * max|reference|)

with u the unit roundoff of the measured precision (a floor for a baseline that happens to be exact).
Every tensor is judged: the block's output, its input gradient and each weight gradient.

The factors were calibrated on GPUs (results/numerics-calibration): the legitimate settings' ratios
to the baseline and the planted corruptions' ratios are printed side by side in those results, and the
factors sit between them with room on both sides (docs/layer-and-memory.md#numerics).
"""
from __future__ import annotations

from collections.abc import Mapping

FACTOR_L2 = 1.5
FACTOR_MAX = 4.0
# unit roundoff 2^-(mantissa bits + 1) of the measured precision; fp8 rounds to e4m3's
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24, "fp64": 2.0 ** -53, "fp8": 2.0 ** -4}
HIGHER = {"bf16": "fp32", "fp16": "fp32", "fp8": "fp32", "fp32": "fp64"}
CRITERION = (f"against the no-overlap block in higher precision (same weights, input, output gradient): "
             f"each tensor's relative L2 error <= {FACTOR_L2:g}x the same-precision no-overlap block's, and its "
             f"max |diff| <= {FACTOR_MAX:g}x that block's")


def judge(errs: Mapping[str, Mapping], base: Mapping[str, Mapping], precision: str) -> dict:
    """The verdict on one setting. ``errs`` and ``base``: {tensor: {"rel_l2", "max_abs", "ref_absmax"}}
    of the setting and of the same-precision no-overlap block, both against the higher-precision block.
    Returns {"ok", "failed": [tensor], "worst": {tensor, l2_ratio, ...}, "tensors": {...}, "criterion", ...};
    a tensor the baseline lacks is a ValueError (the two were not measured alike)."""
    if precision not in UNIT_ROUNDOFF:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(UNIT_ROUNDOFF)}")
    if set(errs) != set(base):
        raise ValueError(f"numerics: the setting measured {sorted(set(errs) ^ set(base))} that the baseline did "
                         "not (or the other way round)")
    u = UNIT_ROUNDOFF[precision]
    rows = {}
    for name, e in errs.items():
        b = base[name]
        l2_ref = max(float(b["rel_l2"]), u)
        max_ref = max(float(b["max_abs"]), u * float(b.get("ref_absmax") or 0.0), 1e-30)
        row = {"rel_l2": float(e["rel_l2"]), "max_abs": float(e["max_abs"]),
               "base_rel_l2": float(b["rel_l2"]), "base_max_abs": float(b["max_abs"]),
               "l2_ratio": float(e["rel_l2"]) / l2_ref, "max_ratio": float(e["max_abs"]) / max_ref}
        row["ok"] = row["l2_ratio"] <= FACTOR_L2 and row["max_ratio"] <= FACTOR_MAX
        rows[name] = row
    failed = sorted(n for n, r in rows.items() if not r["ok"])
    worst = max(rows, key=lambda n: max(rows[n]["l2_ratio"] / FACTOR_L2, rows[n]["max_ratio"] / FACTOR_MAX),
                default=None)
    return {"ok": not failed, "failed": failed, "precision": precision, "reference": HIGHER.get(precision),
            "factor_l2": FACTOR_L2, "factor_max": FACTOR_MAX, "criterion": CRITERION,
            "worst": None if worst is None else {"tensor": worst, **rows[worst]},
            "summary": summary(rows), "tensors": rows}


def summary_text(summ: Mapping[str, Mapping], times: str = "×") -> str:
    """"1.32% (1.00×) / 2.27% (1.00×) / 2.33% (1.00×)": output / input gradient / worst weight gradient of a
    summary(), each tensor's relative L2 error and its ratio to no overlap's."""
    return " / ".join(f"{100 * summ[k]['rel_l2']:.3g}% ({summ[k]['l2_ratio']:.2f}{times})"
                      for k in ("output", "input_grad", "weight_grads") if k in summ)


def summary(rows: Mapping[str, Mapping]) -> dict:
    """The three lines a reader needs: output, input gradient, and the worst weight gradient."""
    out = {k: dict(rows[k]) for k in ("output", "input_grad") if k in rows}
    grads = [n for n in rows if n not in ("output", "input_grad")]
    if grads:
        w = max(grads, key=lambda n: rows[n]["l2_ratio"])
        out["weight_grads"] = {"worst": w, "count": len(grads), **rows[w]}
    return out


def describe_failure(res: Mapping) -> str:
    """"input_grad 36.1% rel. L2 (no overlap 1.0%: 36x), ..." for a failed verdict."""
    parts = []
    for name in res.get("failed") or []:
        r = res["tensors"][name]
        parts.append(f"{name} {100 * r['rel_l2']:.3g}% rel. L2 (no overlap {100 * r['base_rel_l2']:.3g}%: "
                     f"{r['l2_ratio']:.3g}x), max |diff| {r['max_abs']:.3g} (no overlap {r['base_max_abs']:.3g})")
    return "; ".join(parts)

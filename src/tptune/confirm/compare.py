"""The confirm stage's comparisons, on values: per pair of settings the iteration-time ratio over paired rounds
(stats.rounds.paired_ratio, as every session's), and each setting's lm loss / grad norm over the first iterations
against no overlap's, judged against repeat noise.

The loss rule. A setting's *difference* is the largest relative gap, over the first ``loss_iters`` iterations and
every round both launched, between its value and no overlap's of the same round (same seed, same data). Its
*repeat noise* is the largest relative gap between two rounds of the same setting at the same iteration (the
setting's own, or no overlap's, whichever is larger): what a rerun of unchanged code moves. The setting passes
when its difference is at most ``factor`` times that noise, or at most ``floor`` (relative), whichever is larger:
the floor stands for what a different reduction order moves in bf16 training when each setting repeats itself
bit for bit (noise 0). A difference beyond it fails the setting.

A single round has no repeat, so no noise to judge against: the rule then judges nothing (``ok`` None, "not
judged"), except a difference beyond ``GROSS`` (relative), which no reduction order explains (NVIDIA's TP 2 preset
under reduce-scatter-dgrad switches corrupts the input gradient by 141%) and fails the setting. On 4x H200
(Llama-3-70B shapes, 2 layers, one round) the tuned set and NVIDIA's preset each differed from no overlap's lm loss
by 4e-4 over iterations 1-10 (the loss falls to 0.3 on mock data, so the relative gaps grow), beyond the 1e-4 floor:
the floor alone cannot tell a reduction order from a defect.
"""
from __future__ import annotations

import math
from itertools import combinations

from tptune.stats.rounds import paired_ratio
from tptune.stats.wording import classify_ratio

LOSS_FACTOR = 3.0
LOSS_FLOOR = 1e-4          # relative, lm loss
GRAD_FLOOR = 2e-3          # relative, grad norm (printed to 3 decimals: ~1e-3 of a norm near 1)
GROSS = 1e-2               # relative: beyond any reduction order; judged even without a repeat


def rounds_of(launches: list[dict], setting: str) -> dict[int, float]:
    """{round: iteration ms} of the setting's successful launches: ``iteration_ms`` (confirm.launch), or
    ``median_ms`` in records written before it."""
    out = {}
    for x in launches:
        v = x.get("iteration_ms") if x.get("iteration_ms") is not None else x.get("median_ms")
        if x["setting"] == setting and x["status"] == "ok" and v:
            out[x["round"]] = v
    return out


def ratios(launches: list[dict], pairs: list[tuple[str, str]], margin: float) -> dict[str, dict | None]:
    """"a/b" -> the paired ratio record (Ratio.to_dict + its words at ``margin``), None without a common round."""
    out = {}
    for a, b in pairs:
        r = paired_ratio(rounds_of(launches, a), rounds_of(launches, b))
        out[f"{a}/{b}"] = None if r is None else {**r.to_dict(), "words": classify_ratio(r.to_dict(), margin)}
    return out


def _curve(launch: dict, key: str, n: int) -> dict[int, float]:
    return {i["iteration"]: i[key] for i in launch["iterations"]
            if i["iteration"] <= n and i.get(key) is not None and math.isfinite(i[key])}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _gap(c1: dict[int, float], c2: dict[int, float]) -> float | None:
    common = sorted(set(c1) & set(c2))
    return max((_rel(c1[i], c2[i]) for i in common), default=None)


def _ok_by_round(launches: list[dict], setting: str) -> dict[int, dict]:
    return {x["round"]: x for x in launches if x["setting"] == setting and x["status"] == "ok"}


def repeat_noise(launches: list[dict], setting: str, key: str, n: int) -> float | None:
    """The largest relative gap between two rounds of ``setting`` over its first ``n`` iterations (None: fewer
    than two rounds)."""
    runs = list(_ok_by_round(launches, setting).values())
    gaps = [g for a, b in combinations(runs, 2) if (g := _gap(_curve(a, key, n), _curve(b, key, n))) is not None]
    return max(gaps) if gaps else None


def numerics(launches: list[dict], setting: str, reference: str, *, n: int, factor: float = LOSS_FACTOR,
             floors: dict[str, float] | None = None) -> dict:
    """The loss rule (module doc) for ``setting`` against ``reference`` (no overlap), per metric (lm loss, grad
    norm): difference, repeat noise, the allowed gap, and ``ok``; ``ok`` overall. ``ok`` is None when the two
    never ran in one round."""
    floors = floors or {"loss": LOSS_FLOOR, "grad_norm": GRAD_FLOOR}
    mine, ref = _ok_by_round(launches, setting), _ok_by_round(launches, reference)
    common = sorted(set(mine) & set(ref))
    out: dict = {"against": reference, "iterations": n, "rounds": common, "factor": factor}
    oks = []
    for key in ("loss", "grad_norm"):
        gaps = [g for r in common if (g := _gap(_curve(mine[r], key, n), _curve(ref[r], key, n))) is not None]
        noises = [x for x in (repeat_noise(launches, setting, key, n), repeat_noise(launches, reference, key, n))
                  if x is not None]
        noise = max(noises) if noises else None
        allowed = max(floors[key], factor * noise) if noise is not None else GROSS
        diff = max(gaps) if gaps else None
        if diff is None:
            ok = None
        elif noise is None:     # one round: only a gross difference is judged (module doc)
            ok = False if diff > GROSS else None
        else:
            ok = diff <= allowed
        oks.append(ok)
        out[key] = {"difference": _round(diff), "repeat_noise": _round(noise), "floor": floors[key],
                    "allowed": _round(allowed), "ok": ok,
                    "why": "not judged: one round has no repeat noise (only a gross difference fails)"
                    if noise is None and ok is None and diff is not None else None}
    out["ok"] = False if False in oks else (None if None in oks else True)
    return out


def _round(x: float | None):
    return None if x is None else float(f"{x:.3g}")

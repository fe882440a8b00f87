"""The confirm stage's comparisons, on values: per pair of settings the iteration-time ratio over paired rounds
(stats.rounds.paired_ratio, as every session's), and each setting's lm loss / grad norm over the first iterations
against no overlap's, judged against repeat noise.

The loss rule. A setting's *difference* is the largest relative gap, over the first ``loss_iters`` iterations and
every round both launched, between its value and no overlap's of the same round (same seed, same data). Its
*repeat noise* is the largest relative gap between two rounds of the same setting at the same iteration (the
setting's own, or no overlap's, whichever is larger): what a rerun of unchanged code moves. The setting passes
when its difference is at most ``factor`` times that noise, or at most ``floor`` (relative), whichever is larger:
the floor stands for what a different reduction order moves in bf16 training when each setting repeats itself
bit for bit (noise 0), and for a single round (no repeat, no noise). A difference beyond it fails the setting.
"""
from __future__ import annotations

import math
from itertools import combinations

from tptune.stats.rounds import paired_ratio
from tptune.stats.wording import classify_ratio

LOSS_FACTOR = 3.0
LOSS_FLOOR = 1e-4          # relative, lm loss
GRAD_FLOOR = 2e-3          # relative, grad norm (printed to 3 decimals: ~1e-3 of a norm near 1)


def rounds_of(launches: list[dict], setting: str) -> dict[int, float]:
    """{round: median iteration ms} of the setting's successful launches."""
    return {x["round"]: x["median_ms"] for x in launches
            if x["setting"] == setting and x["status"] == "ok" and x["median_ms"]}


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
        allowed = max(floors[key], factor * noise) if noise is not None else floors[key]
        diff = max(gaps) if gaps else None
        ok = None if diff is None else diff <= allowed
        oks.append(ok)
        out[key] = {"difference": _round(diff), "repeat_noise": _round(noise), "floor": floors[key],
                    "allowed": _round(allowed), "ok": ok}
    out["ok"] = None if None in oks else all(oks)
    return out


def _round(x: float | None):
    return None if x is None else float(f"{x:.3g}")

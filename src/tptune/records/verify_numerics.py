"""The numerics of ``tptune verify`` runs (results/numerics-calibration/): per run, the largest error ratio any
legitimate setting reached and each deliberately mismatched pair's (``verify --pair``) worst tensor.

Each setting's run.json holds its per-tensor errors against the higher-precision block beside the
same-precision no-overlap block's (``correctness.tensors``: ``l2_ratio``, ``max_ratio``). A setting is a
mismatched pair when verify.json's block row records the ``switches`` it ran under; every other setting is
legitimate. benchmarks/numerics_calibration.py prints this table; ``tptune figures`` quotes it (kind
``verify_numerics``).
"""
from __future__ import annotations

import json
from pathlib import Path

from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import read_point


def runs(folder: Path) -> dict[str, dict]:
    """{run: {"pairs": {setting: switches}, "settings": {setting: point}, "tp", "model"}} of every verify run
    under ``folder`` (each a folder with verify.json)."""
    out = {}
    for v in sorted(Path(folder).glob("*/verify.json")):
        res = json.loads(v.read_text())
        pairs = {r["setting"]: r.get("switches") for r in res["block"]["rows"] if r.get("switches")}
        settings = {}
        for rj in sorted(v.parent.glob("sessions/layer/tp*/*/run.json")):
            if rj.parent.name != "canary":
                settings[rj.parent.name] = read_point(rj)
        out[v.parent.name] = {"pairs": pairs, "settings": settings, "tp": res["tp"], "model": res["model"]}
    return out


def worst(point: MeasuredPoint | None) -> tuple[str, float, float] | None:
    """(tensor, its rel. L2 ratio, the largest max |diff| ratio of any tensor) of a setting, its worst
    tensor by L2 ratio; None where it recorded no tensors (it failed before the check)."""
    t = ((point.correctness if point is not None else None) or {}).get("tensors") or {}
    if not t:
        return None
    name = max(t, key=lambda n: t[n]["l2_ratio"])
    return name, t[name]["l2_ratio"], max(r["max_ratio"] for r in t.values())


def table(folder: Path) -> list[dict]:
    """Per verify run under ``folder``: its legitimate settings, their largest rel. L2 and max |diff| ratios
    over every tensor, and each mismatched pair's worst tensor (or how it failed)."""
    rows = []
    for name, r in runs(folder).items():
        legit = {s: worst(j) for s, j in r["settings"].items() if s not in r["pairs"] and worst(j)}
        row = {"run": name, "model": r["model"], "tp": r["tp"],
               "legit_settings": sorted(legit),
               "legit_max_l2": max((w[1] for w in legit.values()), default=None),
               "legit_max_maxdiff": max((w[2] for w in legit.values()), default=None),
               "pairs": {}}
        for s in r["pairs"]:
            j = r["settings"].get(s)
            w = worst(j)
            row["pairs"][s] = ({"status": j and j.status, "error": ((j and j.error_message) or "")[:120]}
                               if w is None else {"worst": w[0], "l2_ratio": w[1], "max_ratio": w[2],
                                                  "failed": not j.correct})
        rows.append(row)
    return rows

"""The numerics factors (stats.numerics.FACTOR_L2, FACTOR_MAX) against what the GPUs measured.

Reads every `tptune verify` session under results/numerics-calibration/ (each setting's run.json holds its
per-tensor errors against the higher-precision block beside the same-precision no-overlap block's) and
prints, per run, the largest ratio any legitimate setting reached (no overlap, TE defaults, NVIDIA's
presets, tptune's files: every tensor) and, for each deliberately mismatched pair (verify --pair), the
ratio of its worst tensor or how TE failed it. The factors must sit above the first and below the second.

    python benchmarks/numerics_calibration.py [results/numerics-calibration]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import read_point

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "results" / "numerics-calibration"


def runs(folder: Path = DEFAULT) -> dict[str, dict]:
    """{run: {"pairs": {setting: switches}, "settings": {setting: run.json}}} of every verify run there."""
    out = {}
    for v in sorted(folder.glob("*/verify.json")):
        res = json.loads(v.read_text())
        pairs = {r["setting"]: r.get("switches") for r in res["block"]["rows"] if r.get("switches")}
        settings = {}
        for rj in sorted(v.parent.glob("sessions/layer/tp*/*/run.json")):
            if rj.parent.name != "canary":
                settings[rj.parent.name] = read_point(rj)
        out[v.parent.name] = {"pairs": pairs, "settings": settings, "tp": res["tp"], "model": res["model"]}
    return out


def worst(point: MeasuredPoint | None) -> tuple[str, float, float] | None:
    """(tensor, its rel. L2 ratio, its max |diff| ratio) of the setting's worst tensor, by L2 ratio."""
    t = ((point.correctness if point is not None else None) or {}).get("tensors") or {}
    if not t:
        return None
    name = max(t, key=lambda n: t[n]["l2_ratio"])
    return name, t[name]["l2_ratio"], max(r["max_ratio"] for r in t.values())


def table(folder: Path = DEFAULT) -> list[dict]:
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


def main(argv=None) -> int:
    from tptune.stats.numerics import FACTOR_L2, FACTOR_MAX

    folder = Path((argv or sys.argv[1:] or [DEFAULT])[0])
    print(f"factors: rel. L2 {FACTOR_L2:g}x, max |diff| {FACTOR_MAX:g}x the same-precision no-overlap block's")
    for row in table(folder):
        print(f"\n{row['run']} ({row['model']}, TP {row['tp']}): legitimate settings {', '.join(row['legit_settings'])}")
        print(f"  largest ratio over every tensor: rel. L2 {row['legit_max_l2']:.3f}x, max |diff| "
              f"{row['legit_max_maxdiff']:.3f}x")
        for s, p in row["pairs"].items():
            if "worst" in p:
                print(f"  mismatched pair {s}: worst {p['worst']} rel. L2 {p['l2_ratio']:.2f}x, max |diff| "
                      f"{p['max_ratio']:.2f}x -> {'FAILED' if p['failed'] else 'passed'}")
            else:
                print(f"  mismatched pair {s}: {p['status']}: {p['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

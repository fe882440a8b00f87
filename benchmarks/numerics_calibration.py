"""The numerics factors (stats.numerics.FACTOR_L2, FACTOR_MAX) against what the GPUs measured.

Reads every `tptune verify` session under results/numerics-calibration/ (each setting's run.json holds its
per-tensor errors against the higher-precision block beside the same-precision no-overlap block's) and
prints, per run, the largest ratio any legitimate setting reached (no overlap, TE defaults, NVIDIA's
presets, tptune's files: every tensor) and, for each deliberately mismatched pair (verify --pair), the
ratio of its worst tensor or how TE failed it (records.verify_numerics). The factors must sit above the first
and below the second.

    python benchmarks/numerics_calibration.py [results/numerics-calibration]
"""
from __future__ import annotations

import sys
from pathlib import Path

from tptune.records import verify_numerics

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "results" / "numerics-calibration"


def runs(folder: Path = DEFAULT) -> dict[str, dict]:
    return verify_numerics.runs(folder)


def table(folder: Path = DEFAULT) -> list[dict]:
    return verify_numerics.table(folder)


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

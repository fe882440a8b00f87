"""NVIDIA's presets bare and as its performance configs run them (with the layernorm SM margins), and a tuned
file, on one block: the pooled ratios of the `tptune verify` sessions that scripts/gpu_recipe_env.sh
recorded (each session a block, stats.pooled), printed and written as JSON.

    python benchmarks/recipe_env.py results/recipe-env-h200x2        # reads <dir>/verify-*/sessions/layer/tp2
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tptune.records.sessions import load_session
from tptune.stats.pooled import run_pairs, pooled_ratio
from tptune.stats.wording import classify_ratio

PAIRS = [  # (a, b, what a / b says)
    ("ub.nemo_tp4_recipe", "ub.nemo_tp4", "nemo_tp4 with / without the recipe's layernorm SM margins"),
    ("ub.nvidia_bf16_tp2_recipe", "ub.nvidia_bf16_tp2", "nvidia_bf16_tp2 with / without them"),
    ("ub.user1", "ub.nemo_tp4_recipe", "tuned file / nemo_tp4 as NVIDIA runs it"),
    ("ub.user1", "ub.nvidia_bf16_tp2_recipe", "tuned file / nvidia_bf16_tp2 as NVIDIA runs it"),
    ("ub.user1", "ub.nvidia_bf16_tp2", "tuned file / nvidia_bf16_tp2 bare"),
    ("ub.user1", "ub.launcher_h100_tp2", "tuned file / the launcher's H100 TP 2 file"),
    ("ub.launcher_h100_tp2", "ub.nvidia_bf16_tp2", "launcher's H100 TP 2 file / nvidia_bf16_tp2"),
    ("ub.user1", "none", "tuned file / no overlap"),
]


def pooled(folder: Path, margin: float = 0.02) -> list[dict]:
    sessions = [load_session(d / "sessions" / "layer" / "tp2", d.name)
                for d in sorted(folder.glob("verify-*")) if (d / "sessions" / "layer" / "tp2").is_dir()]
    out = []
    for a, b, what in PAIRS:
        ca, cb = f"layer-tp2-{a}", f"layer-tp2-{b}"
        p = pooled_ratio(run_pairs(sessions, ca, cb))
        if p is None:
            continue
        d = p.to_dict()
        out.append({"a": a, "b": b, "what": what, **d, "words": classify_ratio(d, margin)})
    return out


def main(argv: list[str]) -> int:
    folder = Path(argv[1])
    rows = pooled(folder)
    for r in rows:
        print(f"{r['what']:<52} {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}], {r['rounds']} rounds over "
              f"{r['pooled_sessions']} sessions{' (heterogeneous)' if r['heterogeneous'] else ''}: {r['words']}")
    (folder / "pooled.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

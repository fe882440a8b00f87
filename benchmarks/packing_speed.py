"""How fast the packing model packs (tptune.packing.rules): a million sequence lengths, one step after another, by
each rule, timed by wall clock on this machine (no test holds the figure: it is the machine's).

The lengths are the committed synthetic distribution (config/packing/rl-bimodal.txt) scaled to a long-context
rollout (x 10: up to 15360 tokens) and drawn to a million; the budget and T are 16384. The Karmarkar-Karp of
the verl rule costs the sequences times the micro-batches per step (k = step tokens / budget), so
``--seqs-per-step`` moves its figure most.

  python benchmarks/packing_speed.py [--n 1000000] [--seqs-per-step 64] [--budget 16384]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

from tptune.packing import rules  # noqa: E402
from tptune.packing.lengths import load_lengths  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="sequence lengths packed")
    ap.add_argument("--seqs-per-step", type=int, default=64)
    ap.add_argument("--budget", type=int, default=16384, help="max_token_len of verl/slime, and T of fill")
    ap.add_argument("--tp", type=int, default=4)
    a = ap.parse_args(argv)
    base = load_lengths("config/packing/rl-bimodal.txt", ROOT) * 10
    lengths = np.random.default_rng(0).choice(base, size=a.n, replace=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{a.n} lengths (mean {lengths.mean():.0f}, max {lengths.max()}), {a.seqs_per_step} a step, budget/T "
          f"{a.budget}, TP {a.tp}; {os.cpu_count()} cores, load average {load:.1f}")
    total = 0.0
    for rule in rules.RULES:
        kw = {"capacity": a.budget} if rule == "fill" else {"max_token_len": a.budget}
        t = time.perf_counter()
        steps = rules.pack_steps(lengths, rule, seqs_per_step=a.seqs_per_step, rng=1, tp=a.tp, **kw)
        dt = time.perf_counter() - t
        total += dt
        s = rules.summarize(steps)
        print(f"  {rule:5s} {dt:6.2f} s   {s['micro_batches_per_step']:6.2f} micro-batches a step, padding "
              f"{100 * s['padding_share']:5.2f}%, largest {s['largest_micro_batch']} tokens")
    print(f"all three rules: {total:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write config/packing/rl-bimodal.txt: SYNTHETIC sequence lengths (prompt + response tokens) shaped like an RL
rollout batch, for the packing example (config/packing-example.yaml, docs/packing.md). Not measured from any
model: a fixed-seed draw, sized for the tiny CPU model (at most 1536 tokens).

  prompt    lognormal around 120 tokens, clipped to [16, 256]
  response  bimodal: 55% short answers (lognormal around 180), 45% long reasoning (lognormal around 700) with a
            long tail; 6% of all responses run into the generation limit (1280) and are truncated there, the
            spike at the cap that max_new_tokens makes

    python scripts/make_rl_bimodal_lengths.py        # rewrites the file; the same bytes every time
"""
from pathlib import Path

import numpy as np

SEED, N, PROMPT_MAX, RESPONSE_MAX = 53, 20000, 256, 1280
OUT = Path(__file__).resolve().parents[1] / "config" / "packing" / "rl-bimodal.txt"


def lengths(seed: int = SEED, n: int = N) -> np.ndarray:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(np.log(120), 0.45, n), 16, PROMPT_MAX)
    long = rng.random(n) < 0.45
    response = np.where(long, rng.lognormal(np.log(700), 0.45, n), rng.lognormal(np.log(180), 0.5, n))
    response[rng.random(n) < 0.06] = RESPONSE_MAX
    response = np.clip(response, 1, RESPONSE_MAX)
    return (np.rint(prompt) + np.rint(response)).astype(np.int64)


if __name__ == "__main__":
    x = lengths()
    head = ("# SYNTHETIC RL-like sequence lengths (prompt + response tokens), one a line: not measured from any model.\n"
            f"# Written by scripts/make_rl_bimodal_lengths.py (seed {SEED}, {N} sequences): bimodal responses (short "
            "answers, long reasoning)\n# with a long tail and a spike at the generation limit; at most "
            f"{PROMPT_MAX + RESPONSE_MAX} tokens. docs/packing.md.\n")
    OUT.write_text(head + "".join(f"{v}\n" for v in x))
    q = np.percentile(x, [50, 90, 99])
    print(f"{OUT}: {x.size} lengths, mean {x.mean():.0f}, p50 {q[0]:.0f}, p90 {q[1]:.0f}, p99 {q[2]:.0f}, max {x.max()}")

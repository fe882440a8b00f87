"""Interval union/intersection against a brute-force coverage count."""

import numpy as np
import polars as pl

from tptune.trace.intervals import merged_segments, outermost, union_length


def _coverage(starts, ends) -> int:
    cov = np.zeros(max(ends, default=0) + 1, dtype=bool)
    for s, e in zip(starts, ends):
        cov[s:e] = True
    return int(cov.sum())


def test_union_matches_brute_force_per_group():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 80))
        df = pl.DataFrame(
            {"g": rng.integers(0, 3, n), "h": rng.choice(["a", "b"], n), "start": rng.integers(0, 2000, n)}
        ).with_columns(end=pl.col("start") + pl.Series(rng.integers(0, 300, n)))
        got = {(r["g"], r["h"]): r["length"] for r in union_length(df, ["g", "h"]).iter_rows(named=True)}
        seg = merged_segments(df, ["g", "h"]).with_columns(len=pl.col("end") - pl.col("start"))
        from_segments = {(a, b): c for a, b, c in seg.group_by("g", "h").agg(pl.col("len").sum()).iter_rows()}
        expected = {k: _coverage(g["start"], g["end"]) for k, g in df.group_by(["g", "h"])}
        assert got == expected == from_segments


def test_intersection_by_inclusion_exclusion_at_realistic_timestamps():
    base = 4455598352206106  # ns, as in real traces: needs exact integer maths
    a = pl.DataFrame({"start": [base, base + 1000], "end": [base + 500, base + 3000]})
    b = pl.DataFrame({"start": [base + 400, base + 2999], "end": [base + 1500, base + 4000]})
    ua, ub = union_length(a, [])["length"][0], union_length(b, [])["length"][0]
    both = union_length(pl.concat([a, b]), [])["length"][0]
    assert (ua, ub, ua + ub - both) == (2500, 2101, 100 + 500 + 1)


def test_outermost_drops_nested_ranges_per_thread():
    df = pl.DataFrame(
        {
            "tid": [1, 1, 1, 1, 2],
            "start": [0, 0, 5, 20, 3],
            "end": [10, 10, 8, 30, 4],  # duplicate [0,10): only one of them is outermost
        }
    )
    mask = outermost(df, ["tid"]).to_list()
    assert mask[2:] == [False, True, True] and sum(mask[:2]) == 1

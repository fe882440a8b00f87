"""How long must a round's timed window be? The noise of a side-by-side ratio against what a round costs.

A session compares settings through per-round log ratios (search.rounds); how many rounds a
comparison needs goes with the variance of those ratios, and a round costs its timed window plus a
fixed overhead (build, warm-up, pre-roll, close). A longer window rides out more of the card's power
episodes (worker.timing.timed_iters) and costs more. This measures the trade on real hardware:

For each op it runs one session of two settings (default: no overlap and the no-communication bound,
which at TP=1 are the same work: a null pair) through the tuning harness (Launcher.session), fixed
``--rounds`` alternating rounds, each round timing ``--window-ms`` of GPU work. Every round's timed
iterations are recorded in order, so the first W ms of that window are exactly what a window of W ms
would have timed (the same build, pre-roll and hold). For each W in ``--windows`` it prints:

- sd: the standard deviation of the per-round log ratio (what the interval's width scales with);
- rounds: the rounds a comparison needs for its 95% half-width to reach ``--half`` (1%: an interval
  of a tie that sits at 1.00 lies inside the 2% noise floor), from that sd;
- s/decision: those rounds times the two members' cost of a round (W + the measured overhead).

The same recording prices the pre-roll (worker.timing: the op's own work run untimed before the timed
window, so that the card's clock has settled from its idle boost). Run with ``--preroll-ms 0`` (then
only the warm-up, the probe and PREROLL_MIN iterations precede the window), and each S in ``--skips``
drops the first S ms of every recorded window: the rest is what a pre-roll of S ms more would have
timed, the same work in the same order. Each (S, W) row also gives each member's level: the mean over
rounds of its value against the row of the longest S at the same W (below 1: the short pre-roll
times the op faster, on a clock that has not settled).

``--from-noise FILE ...`` measures nothing: it reads benchmarks/measure_noise.py recordings (made with
``--against``, each call one batch or several of a setting and then of the reference, the iterations in
order) and asks the same of them, pairing a setting with its reference by call: per (skip, window) the
pooled sd of the per-call log ratio with its 95% interval, and the ratio's bias against the settled
part of the window (``--settled SKIP,WINDOW``). So the machines whose recordings are committed
(results/noise-x2: 2xH200) answer without a lease.

``--shard N`` divides the heads, query groups and FFN width by N: one GPU then runs the per-rank
GEMMs of TP=N (without its collectives), so the single-GPU machine measures the ops' TP=N durations.

  python benchmarks/window_length.py --config config/gpu/h200x2-llama3-70b.yaml --tp 1 --shard 2 \
      [--rounds 12] [--window-ms 1000] [--windows 100,250,500,1000] [--json out.json]
      [--preroll-ms 0 --skips 0,25,50,100,150]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tptune.cases import make_case
from tptune.measure.launch import Launcher
from tptune.measure.session_spec import SessionSpec
from tptune.records.sessions import read_point
from tptune.stats.rounds import log_ratio_interval, t975
from tptune.cli.calibrate import load_sharded, member_record, sd_interval  # noqa: F401
from tptune.stats.window import call_batches, split_rounds, window_value  # noqa: F401



def log_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-round log ratios of two members paired by round."""
    return [math.log(x) - math.log(y) for x, y in zip(a, b)]


def rounds_needed(sd: float, half: float, most: int = 1000) -> int:
    """The fewest rounds n >= 2 whose 95% half-width of the mean log ratio, t(n-1) * sd / sqrt(n), is
    at most log(1 + half); ``most`` when even that many do not reach it."""
    target = math.log1p(half)
    for n in range(2, most + 1):
        if t975(n - 1) * sd / math.sqrt(n) <= target:
            return n
    return most


def analyse(members: dict[str, dict], windows: list[float], half: float,
            skips: tuple[float, ...] = (0.0,)) -> list[dict]:
    """One row per (skip, window): sd of the pair's log ratio, rounds needed, seconds per decision, and
    each member's level against the longest skip at the same window."""
    (a, ra), (b, rb) = list(members.items())[:2]
    rows, values = [], {}
    for skip in skips:
        for w in windows:
            va = [window_value(r, w, ra["min_iters"], skip) for r in ra["rounds"]]
            vb = [window_value(r, w, rb["min_iters"], skip) for r in rb["rounds"]]
            values[skip, w] = va, vb
            ds = log_ratios(va, vb)
            sd = statistics.stdev(ds) if len(ds) >= 2 else math.inf
            n = rounds_needed(sd, half)
            gpu_w = [min(w + skip, sum(r)) for r in ra["rounds"] + rb["rounds"]]   # the GPU time it runs
            cost = 2 * (statistics.fmean(gpu_w) / 1e3 + (ra["overhead_s"] + rb["overhead_s"]) / 2)
            rows.append({"skip_ms": skip, "window_ms": w, "sd": sd, "ratio": math.exp(statistics.fmean(ds)),
                         "rounds": n, "round_pair_s": cost, "s_per_decision": n * cost})
    ref = max(skips)
    for row in rows:
        mine, theirs = values[row["skip_ms"], row["window_ms"]], values[ref, row["window_ms"]]
        row["level"] = [math.exp(statistics.fmean(log_ratios(m, t))) for m, t in zip(mine, theirs)]
    return rows


def batches_log_value(batches: list[list[float]], window_ms: float, min_iters: int, skip_ms: float) -> float:
    """log of a call's value at (skip, window): the mean over its batches of log window_value."""
    return statistics.fmean(math.log(window_value(b, window_ms, min_iters, skip_ms)) for b in batches)


def noise_pairs(recording: dict) -> dict[str, tuple[list, list]]:
    """{op: (the setting's calls, the reference's calls)} of a measure_noise recording made with --against."""
    calls = recording["calls"]
    out = {}
    for key, ref in calls.items():
        op, _, mode = key.partition("/")
        if mode.startswith("gpu:") and f"{op}/gpu" in calls:
            out[op] = (calls[f"{op}/gpu"], ref)
    return out


def replay_noise(recordings: list[dict], windows: list[float], skips: tuple[float, ...],
                 settled: tuple[float, float], min_iters: int) -> dict:
    """Per (skip, window): the pooled sd of the per-call log ratio (setting / reference) over every op
    of every recording, its interval, and per op the ratio against the settled (skip, window), the
    mean over calls with its 95% interval."""
    # (op, [(setting's batches, reference's batches) per call])
    pairs = [(op, [(call_batches(a), call_batches(b)) for a, b in zip(a_calls, b_calls)])
             for rec in recordings for op, (a_calls, b_calls) in noise_pairs(rec).items()]
    if not pairs:
        raise ValueError("no recording holds a setting and its reference (measure_noise --against)")
    recorded = statistics.median(sum(batch) for _, calls in pairs for a, b in calls for batch in a + b)
    if sum(settled) > recorded * 1.01:
        raise ValueError(f"the settled skip plus window ({sum(settled):.0f} ms) exceeds the recorded windows "
                         f"({recorded:.0f} ms, the median batch)")

    def log_ratio(a, b, w, skip):
        return batches_log_value(a, w, min_iters, skip) - batches_log_value(b, w, min_iters, skip)
    settled_skip, settled_w = settled
    settled_ratio = [[log_ratio(a, b, settled_w, settled_skip) for a, b in calls] for _, calls in pairs]
    rows = []
    for skip in skips:
        for w in windows:
            if skip + w > recorded * 1.01:       # past the recorded window: it would time less than w
                continue
            ss, df, bias = 0.0, 0, {}
            for (op, calls), settled_ds in zip(pairs, settled_ratio):
                ds = [log_ratio(a, b, w, skip) for a, b in calls]
                ss += statistics.variance(ds) * (len(ds) - 1)
                df += len(ds) - 1
                bias.setdefault(op, []).extend(d - s for d, s in zip(ds, settled_ds))
            sd = math.sqrt(ss / df)
            lo, hi = sd_interval(sd, df)
            rows.append({"skip_ms": skip, "window_ms": w, "sd": sd, "sd_lo": lo, "sd_hi": hi, "df": df,
                         "bias": {op: _interval(v) for op, v in bias.items()}})
    return {"pairs": len(pairs), "settled": list(settled), "recorded_ms": recorded, "table": rows}


def _interval(logs: list[float]) -> list[float]:
    """[ratio, lo, hi, n] of per-call log ratios (rounds.log_ratio_interval)."""
    r = log_ratio_interval(logs)
    return [r.ratio, r.lo, r.hi, r.rounds]


def print_noise_replay(res: dict, files: list[str]) -> None:
    skip, w = res["settled"]
    print(f"{len(files)} recording(s), {res['pairs']} (op, recording) pairs, windows of {res['recorded_ms']:.0f} ms "
          f"recorded (the median batch; a skip plus a window beyond it is left out); paired by call")
    print(f"{'skip':>5} {'window':>6} {'pooled sd [95%]':>24} {'df':>4}  ratio / ratio at skip {skip:.0f}, "
          f"window {w:.0f} [95%]")
    for r in res["table"]:
        bias = "  ".join(f"{op} {b[0]:.4f} [{b[1]:.4f}, {b[2]:.4f}]" for op, b in r["bias"].items())
        print(f"{r['skip_ms']:5.0f} {r['window_ms']:6.0f} {r['sd'] * 100:7.2f}% [{r['sd_lo'] * 100:.2f}, "
              f"{r['sd_hi'] * 100:.2f}] {r['df']:4d}  {bias}")


def print_windows(out: dict, windows: list[float], skips: tuple[float, ...], pair: list[str]) -> None:
    """Per op and skip: sd, rounds and seconds per decision at each window; then the members' levels."""
    print(f"{'op':5} {'ms/iter':>8} {'overhead s':>10} {'skip':>5} " + " ".join(f"{w:>18.0f}" for w in windows))
    print(f"{'':5} {'':>8} {'':>10} {'ms':>5} " + " ".join(f"{'sd% rounds s/dec':>18}" for _ in windows))
    for op, d in out["ops"].items():
        first = next(iter(d["members"].values()))
        ms = statistics.median(t for r in first["rounds"] for t in r)
        ovh = statistics.fmean(m["overhead_s"] for m in d["members"].values())
        for skip in skips:
            rows = [r for r in d["table"] if r["skip_ms"] == skip]
            cells = " ".join(f"{r['sd'] * 100:6.2f} {r['rounds']:4d} {r['s_per_decision']:6.1f}" for r in rows)
            print(f"{op:5} {ms:8.3f} {ovh:10.3f} {skip:5.0f} {cells}")
    if len(skips) > 1:
        print(f"each member's level against a skip of {skips[-1]:.0f} ms at the same window, % ({' / '.join(pair)})")
        for op, d in out["ops"].items():
            for skip in skips[:-1]:
                rows = [r for r in d["table"] if r["skip_ms"] == skip]
                cells = " ".join(f"{'/'.join(f'{(x - 1) * 100:+.1f}' for x in r['level']):>18}" for r in rows)
                print(f"{op:5} {'':>8} {'':>10} {skip:5.0f} {cells}")


def _floats(text: str) -> tuple[float, ...]:
    """A comma-separated option's numbers, sorted."""
    return tuple(sorted(float(x) for x in text.split(",")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="run config(s) merged over config/config.yaml")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--shard", type=int, default=1, help="divide heads, query groups and FFN width by N")
    ap.add_argument("--ops", default=None, help="comma-separated ops (default: the config's)")
    ap.add_argument("--pair", default="none,nocomm", help="the two settings of each op's session")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--window-ms", type=float, default=1000.0, help="GPU time timed per round (GPU-bound ops)")
    ap.add_argument("--windows", default="100,200,300,400,500,750,1000",
                    help="windows (ms) to evaluate from the recorded rounds (at most --window-ms)")
    ap.add_argument("--half", type=float, default=0.01, help="95%% half-width a comparison needs")
    ap.add_argument("--preroll-ms", type=float, default=None, help="the sessions' pre-roll (default: the config's)")
    ap.add_argument("--skips", default="0", help="ms dropped from the start of each window: more pre-roll, post hoc")
    ap.add_argument("--json", help="write the rounds and the table here")
    ap.add_argument("--from-noise", nargs="+", metavar="FILE", help="replay measure_noise recordings instead")
    ap.add_argument("--settled", default="200,300", help="SKIP,WINDOW of the settled part (--from-noise)")
    ap.add_argument("--min-iters", type=int, default=10, help="timed iterations a window keeps (--from-noise)")
    a = ap.parse_args(argv)
    if a.from_noise:
        return main_from_noise(a, ap)
    try:
        s, mc, ops = load_sharded(a.config, a.shard, a.ops)
    except ValueError as e:
        raise SystemExit(f"--shard: {e}")
    pair = a.pair.split(",")
    windows = [w for w in _floats(a.windows) if w <= a.window_ms]
    skips = _floats(a.skips)
    if len(pair) != 2 or not windows:
        ap.error("--pair takes two settings and --windows at least one window <= --window-ms")
    if skips[0] < 0 or skips[-1] + windows[-1] > a.window_ms:
        ap.error("--skips: each skip plus the longest window must fit in --window-ms")
    launcher = Launcher(s)
    out: dict = {"model": mc.model.name, "tp": a.tp, "shard": a.shard, "pair": pair, "rounds": a.rounds,
                 "window_ms": a.window_ms, "half": a.half, "preroll_ms": a.preroll_ms, "skips": list(skips),
                 "ops": {}}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tptune-window-") as tmp:
        for op in ops:
            members = [make_case(op, a.tp, v) for v in pair]
            op_settings = s.op(op).as_dict()
            op_settings.update(check=False, timing=dict(op_settings["timing"], min_rounds=a.rounds,
                                                        max_rounds=a.rounds, profile_steps=0,
                                                        window_ms=a.window_ms))
            if a.preroll_ms is not None:
                op_settings["timing"]["preroll_ms"] = a.preroll_ms
            rec = launcher.session(SessionSpec(f"window/{op}", members, mc, op_settings, evidence=False),
                                   Path(tmp) / op)
            runs = {c.id: read_point(Path(tmp) / op / rec["runs"][c.id]) for c in members}
            bad = [cid for cid, r in runs.items() if r.status != "ok"]
            if bad:
                print(f"{op}: {', '.join(bad)} failed: {runs[bad[0]].error}", file=sys.stderr)
                continue
            mem = {cid: member_record(r) for cid, r in runs.items()}
            out["ops"][op] = {"members": mem, "table": analyse(mem, windows, a.half, skips)}
    print(f"{mc.model.name} TP={a.tp}, {' vs '.join(pair)}, {a.rounds} alternating rounds of a "
          f"{a.window_ms:.0f} ms window per op ({time.monotonic() - t0:.0f} s); rounds for a 95% half-width "
          f"of {a.half:.0%}")
    print_windows(out, windows, skips, pair)
    if a.json:
        Path(a.json).write_text(json.dumps(out, separators=(",", ":")))
    return 0


def main_from_noise(a, ap) -> int:
    windows, skips = list(_floats(a.windows)), _floats(a.skips)
    settled = tuple(float(x) for x in a.settled.split(","))
    if len(settled) != 2:
        ap.error("--settled takes SKIP,WINDOW")
    recordings = []
    for f in a.from_noise:
        try:
            recordings.append(json.loads(Path(f).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            ap.error(f"--from-noise {f}: {e}")
    try:
        res = replay_noise(recordings, windows, skips, settled, a.min_iters)
    except (KeyError, ValueError) as e:
        raise SystemExit(f"--from-noise: {e}")
    print_noise_replay(res, a.from_noise)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(res, files=a.from_noise), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

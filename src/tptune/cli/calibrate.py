"""Calibrate the timed window (timing.window_ms) on this machine: `tptune calibrate-window`.

Why: a round times at least window_ms of an op's GPU work (worker.timing.timed_iters) because the card's
power management moves an op's time in spells of 50-300 ms, which a median over a much longer window
rides out. How long the spells last is the card's own: on the H200s a 500 ms window held a null pair's
per-round sd at 0.9-1.4%; on one H100 it left 3.0%, and 1000 ms 1.4% (results/noise-h100). A session
resolves a tie at the margin m within its round budget B only below resolvable_sd(m, B)
(search.session_noise: 1.89% for 2% and 6 rounds). So the window to use is the shortest one whose noise
the budget resolves with room to spare; longer ones only cost time.

How: per op, one session (launch.Launcher.session, the tuning harness) of a null pair: no overlap and
the bound at TP=1, with the per-rank GEMMs of the run's smallest TP (heads, query groups and FFN width
divided by it), which at TP=1 are the same work, so their per-round log ratio is the noise alone.
BURN_IN + ``rounds`` alternating rounds, each timing the longest candidate window after the run's usual
pre-roll; the burn-in round is left out (the first round of a session reads its first member off, by
-2.7% to +1.6% on the H100s: results/lead-in-h100), and the first W ms of each recorded window are exactly what a W ms window would
have timed (a round holds at most 600 iterations, worker.timing.WINDOW_MAX_ITERS, so a short op's
longest windows may stop short: the table says where). Per candidate W the sd of the per-round log
ratio, pooled over the ops (df = ops x (rounds - 1)), with its 95% interval. Chosen: the shortest W
whose pooled sd is at most TARGET_FRACTION x resolvable_sd(noise_floor, max_rounds) (at 0.75, a tie up
to ~0.5% from 1.00 still resolves within the budget); if none is, the W whose close decision costs
least (rounds go with sd^2, a round costs W plus its overhead), and the report's session noise says
what that left. ``tptune calibrate-window --from window.json`` re-derives a recorded calibration.

One GPU, no collectives: what varies between its rounds is the card. On 2xH200 that was also what moved
TP=2's communicating settings against no overlap (results/window-x2-replay: 1.19% at 500 ms, as one
H200's null pair here). The result is a config overlay (window.yaml) to pass with --configfile.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
from pathlib import Path

from tptune.cases import make_case
from tptune.measure.preflight import resolve_here
from tptune.measure.session_spec import SessionSpec
from tptune.records.measured_point import METRIC, MeasuredPoint
from tptune.records.sessions import read_point
from tptune.settings.resolve import DEFAULTS, ROOT, load_config_files
from tptune.stats.session_noise import resolvable_sd
from tptune.stats.window import split_rounds, window_value  # noqa: F401 (benchmarks read them here too)

CANDIDATES_MS = (500.0, 750.0, 1000.0, 1500.0)
ROUNDS = 8
BURN_IN = 1                  # rounds measured first and left out (calibrate)
TARGET_FRACTION = 0.75
PAIR = ("none", "nocomm")


def sd_interval(sd: float, df: int) -> tuple[float, float]:
    """95% interval of a standard deviation with ``df`` degrees of freedom (chi-square quantiles: exact
    below df = 5, from there by the Wilson-Hilferty approximation, within 1% of the exact ones)."""
    small = {1: (0.000982, 5.024), 2: (0.0506, 7.378), 3: (0.216, 9.348), 4: (0.484, 11.143)}

    def chi2(z):
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    q_lo, q_hi = small[df] if df in small else (chi2(-1.959964), chi2(1.959964))
    return sd * math.sqrt(df / q_hi), sd * math.sqrt(df / q_lo)


def sharded(model, n: int):
    """The model with heads, query groups and FFN width divided by n (one GPU runs TP=n's local GEMMs)."""
    m = model.model
    for name in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        if getattr(m, name) % n:
            raise ValueError(f"shard {n}: {name}={getattr(m, name)} is not divisible by {n}")
    spec = dataclasses.replace(m, name=f"{m.name}/shard{n}", num_attention_heads=m.num_attention_heads // n,
                               num_query_groups=m.num_query_groups // n, ffn_hidden_size=m.ffn_hidden_size // n)
    return dataclasses.replace(model, model=spec)


def load_sharded(config_files: list[str], shard: int = 1, ops: str | None = None):
    """(settings, model, ops) for a one-GPU benchmark: the run config files merged over config/config.yaml,
    the model with TP=``shard``'s per-rank GEMMs (sharded), and the comma-separated ``ops`` (default:
    the run's). Raises ValueError for a shard the model's widths do not divide."""
    cfg = load_config_files(ROOT / DEFAULTS, *config_files)
    s = resolve_here(cfg, source=", ".join(config_files) or "config/config.yaml", node_tps=[1])   # one GPU
    mc = sharded(s.model, shard) if shard > 1 else s.model
    return s, mc, (ops.split(",") if ops else list(s.ops))


def member_record(run: MeasuredPoint) -> dict:
    """Rounds (iterations in order), the minimum timed iterations and the overhead of a round (the
    held time less its timed GPU time) of a member's run.json."""
    t = run.timing[METRIC]
    rounds = split_rounds(list(t.samples), list(t.round_iters))
    held = [a["held_s"] for a in run.attempts if a.get("status") == "ok"]
    overhead = statistics.median(h - sum(r) / 1e3 for h, r in zip(held, rounds))
    return {"rounds": rounds, "min_iters": int(run.settings["timing"]["iters"]), "overhead_s": overhead,
            "held_s": statistics.median(held)}


def pair_log_ratios(a: dict, b: dict, window_ms: float, skip_ms: float = 0.0) -> list[float]:
    """Per-round log ratios of two member records (member_record) at a window of ``window_ms``."""
    return [math.log(window_value(x, window_ms, a["min_iters"], skip_ms))
            - math.log(window_value(y, window_ms, b["min_iters"], skip_ms))
            for x, y in zip(a["rounds"], b["rounds"])]


def reach_ms(recordings: dict[str, dict[str, dict]]) -> dict[str, float]:
    """Per op, the GPU time its rounds recorded (the median round): a window beyond it times no more
    (worker.timing.WINDOW_MAX_ITERS caps a round's iterations, 600: 1.4 s of a 2.4 ms op)."""
    return {op: statistics.median(sum(r) for m in members.values() for r in m["rounds"])
            for op, members in recordings.items()}


def window_table(recordings: dict[str, dict[str, dict]], candidates: list[float], burn_in: int = 0) -> list[dict]:
    """Per candidate window: the pooled sd of the null pairs' per-round log ratios over the ops (each op's
    two member records, recordings[op] = {case id: record}), its 95% interval and df, and each op's sd.
    The first ``burn_in`` rounds are left out (module doc: the first round after an idle spell)."""
    pairs = {op: [{**m, "rounds": m["rounds"][burn_in:]} for m in list(members.values())[:2]]
             for op, members in recordings.items()}
    rows = []
    for w in sorted(candidates):
        ss, df, per_op = 0.0, 0, {}
        for op, (a, b) in pairs.items():
            ds = pair_log_ratios(a, b, w)
            if len(ds) < 2:
                continue
            v = statistics.variance(ds)
            per_op[op] = math.sqrt(v)
            ss += v * (len(ds) - 1)
            df += len(ds) - 1
        if not df:
            continue
        sd = math.sqrt(ss / df)
        lo, hi = sd_interval(sd, df)
        rows.append({"window_ms": w, "sd": sd, "sd_lo": lo, "sd_hi": hi, "df": df, "per_op": per_op})
    return rows


def choose_window(rows: list[dict], target_sd: float, overhead_s: float = 0.0) -> tuple[float | None, str]:
    """(window, why): the shortest window whose pooled sd is at most ``target_sd``; if none is, the one
    whose close decision costs least: the rounds it needs go with sd^2, each costs the window plus the
    round's ``overhead_s`` (build, pre-roll, close), so the least sd^2 x (window + overhead)."""
    if not rows:
        return None, "no candidate window was measured"
    for r in rows:
        if r["sd"] <= target_sd:
            return r["window_ms"], (f"the shortest window whose null pair's per-round sd ({r['sd']:.2%}) is at "
                                    f"most the target {target_sd:.2%}")
    best = min(rows, key=lambda r: r["sd"] ** 2 * (r["window_ms"] / 1e3 + overhead_s))
    return best["window_ms"], (f"no candidate reached the target {target_sd:.2%}; the one whose close decision "
                               f"costs least, sd^2 x (window + {overhead_s:.2f} s a round), at {best['sd']:.2%}: "
                               f"decisions near the margin will end as undecided ties (session noise)")


def target_sd(noise_floor: float, max_rounds: int) -> float:
    """TARGET_FRACTION of what the run's round budget (timing.max_rounds) resolves at its noise floor."""
    return TARGET_FRACTION * resolvable_sd(noise_floor, int(max_rounds))


def analyse(rec: dict) -> dict:
    """``rec`` (a calibration record: members, candidates, burn_in, target_sd) with its table, reach and
    choice (re)computed from the recorded rounds."""
    members = rec["members"]
    rows = window_table(members, rec["candidates"], rec["burn_in"])
    overheads = [m["overhead_s"] for ms in members.values() for m in ms.values()]
    overhead = statistics.median(overheads) if overheads else 0.0
    window, why = choose_window(rows, rec["target_sd"], overhead)
    return {**rec, "table": rows, "reach_ms": reach_ms(members), "overhead_s": overhead,
            "window_ms": window, "why": why}


def calibrate(s, launcher, *, candidates=CANDIDATES_MS, rounds: int = ROUNDS, ops: list[str] | None = None,
              work_dir: Path | None = None) -> dict:
    """Measure the null pairs (module doc) on ``launcher``'s hardware and choose the window. Returns the
    record that window.json holds (the rounds of every member included: ``analyse`` re-derives it).
    Each session runs BURN_IN more rounds than ``rounds`` and leaves them out: on one H100 the first
    round timed fc1's first member up to 5% fast (even after the 150 ms pre-roll), which is not what a
    window decides (results/window-calibration-h100, results/lead-in-h100)."""
    shard = min(s.tp_sizes)
    mc = sharded(s.model, shard) if shard > 1 else s.model
    longest = max(candidates)
    recordings, failed, env = {}, {}, {}
    total = rounds + BURN_IN
    with tempfile.TemporaryDirectory(prefix="tptune-calibrate-", dir=work_dir) as tmp:
        for op in ops or s.ops:
            members = [make_case(op, 1, v) for v in PAIR]
            op_settings = s.op(op).as_dict()
            op_settings.update(check=False, timing=dict(op_settings["timing"], min_rounds=total, max_rounds=total,
                                                        profile_steps=0, window_ms=longest, lead_in=False))
            spec = SessionSpec(f"calibrate/{op}", members, mc, op_settings, evidence=False,
                               faults=s.faults)
            rec = launcher.session(spec, Path(tmp) / op)
            runs = {c.id: read_point(Path(tmp) / op / rec["runs"][c.id]) for c in members}
            bad = {cid: r.error_message or "failed" for cid, r in runs.items() if r.status != "ok"}
            if bad:
                failed[op] = bad
                continue
            recordings[op] = {cid: member_record(r) for cid, r in runs.items()}
            env = env or next(iter(runs.values())).environment or {}
    return analyse(_record(s, candidates, rounds, model=mc.model.name, gpu=env.get("gpu_name"), failed=failed,
                           members=recordings))


def _record(s, candidates, rounds: int, **measured) -> dict:
    """A calibration record's settings part (what ``analyse`` needs and the report shows) and ``measured``."""
    return {"candidates": sorted(candidates), "burn_in": BURN_IN,
            "target_sd": target_sd(s.decision.noise_floor, s.timing.max_rounds),
            "target_fraction": TARGET_FRACTION, "noise_floor": s.decision.noise_floor,
            "max_rounds": int(s.timing.max_rounds), "pair": list(PAIR), "tp": 1,
            "shard": min(s.tp_sizes), "rounds": rounds, "preroll_ms": s.timing.preroll_ms,
            "device": s.device, **measured}


def not_measured(s, candidates) -> dict:
    """The record of a run whose device has no timed window (CPU: a round times timing.iters by wall
    clock): nothing measured, the shortest candidate written so that ``window_ms: auto`` resolves."""
    return _record(s, candidates, 0, model=s.model.model.name, gpu=None, failed={}, members={}, table=[],
                   reach_ms={}, overhead_s=0.0, window_ms=min(candidates),
                   why="CPU: a round times timing.iters by wall clock and has no window; nothing was measured")


def format_table(rec: dict) -> str:
    """The candidates' pooled sd (and per op), the target and the choice, for the terminal."""
    chosen = "none" if rec["window_ms"] is None else f"{rec['window_ms']:.0f} ms"
    if not rec["table"] and not rec["failed"]:
        return f"chosen: {chosen}: {rec['why']}"
    lines = [f"{rec['model']} TP=1 (per-rank GEMMs of TP={rec['shard']}), null pair {' vs '.join(rec['pair'])}, "
             f"{rec['rounds']} alternating rounds per op after {rec['burn_in']} left out; target sd "
             f"{rec['target_sd']:.2%} = {rec['target_fraction']:g} x what {rec['max_rounds']} rounds resolve at "
             f"the {rec['noise_floor']:.0%} margin"]
    ops = sorted({op for r in rec["table"] for op in r["per_op"]})
    lines.append(f"{'window ms':>9} {'pooled sd [95%]':>24} {'df':>4}  " + "  ".join(f"{op:>6}" for op in ops))
    for r in rec["table"]:
        lines.append(f"{r['window_ms']:9.0f} {r['sd']:7.2%} [{r['sd_lo']:.2%}, {r['sd_hi']:.2%}] {r['df']:4d}  "
                     + "  ".join(f"{r['per_op'].get(op, float('nan')):6.2%}" for op in ops))
    short = {op: ms for op, ms in rec.get("reach_ms", {}).items() if ms < max(rec["candidates"]) * 0.99}
    if short:
        lines.append("recorded at most (a round's iterations are capped): "
                     + ", ".join(f"{op} {ms:.0f} ms" for op, ms in sorted(short.items())))
    for op, bad in rec["failed"].items():
        lines.append(f"{op}: not measured ({'; '.join(f'{k}: {v[:200]}' for k, v in bad.items())})")
    lines.append(f"chosen: {chosen}: {rec['why']}")
    return "\n".join(lines)

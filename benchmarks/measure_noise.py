"""How stable is one op's measurement from call to call, with GPU time (host ahead) and with
per-iteration CUDA events (the old harness), side by side?

For every op of the model at one TP and one setting (default: TE-default userbuffers, ub.te), it makes
``--calls`` separate worker calls per timing mode, alternating the modes and the ops, each call
building the layer afresh and timing one batch. It prints per op and mode the median over calls and
the spread (max/min - 1), and the host launch time; target: spread <= 2% for every op whose GPU time
is >= 1 ms.

Beside each GPU-timed call it records the SM clock the batch ran at (NVML, read only) and prints the
spread of time x clock (cycles): where that spread is small and the time's is not, the card's clock
moved, not the harness. With ``--against`` (default: no overlap) each call also times that setting
right after, and the spread of the per-call ratio shows what a side-by-side comparison is left with.

  python benchmarks/measure_noise.py --config config/gpu/h200x2-llama3-70b.yaml [--calls 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tptune.cases import make_case
from tptune.measure.launch import Launcher
from tptune.measure.preflight import resolve_here
from tptune.records.measured_point import MeasuredPoint
from tptune.settings.resolve import load_config_files

ROOT = Path(__file__).resolve().parents[1]
MODES = ("gpu", "events")


def _rounded(x):
    """Floats to 4 decimals (0.1 us on a ms figure), so a committed file stays small."""
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


STEP = 0.04   # a call whose timed iterations spread by more than this stepped inside its batch


def call_cycles(r: dict) -> float:
    """A call's median of time x SM clock, per iteration where the batch has its per-iteration clock."""
    its, mhz = r.get("iterations_ms") or [], r.get("iter_mhz")
    if mhz and len(mhz) == len(its) and any(mhz):
        return statistics.median(t * c for t, c in zip(its, mhz) if c)
    return r["ms"] * r["sm_mhz"]


def print_steps(rows: dict) -> None:
    """Every call whose iterations stepped inside the batch, with the per-iteration SM clock beside the
    time: a step the clock follows (time up, clock down by about as much) is the card's power
    management; one it does not follow is the setting's own."""
    for (op, mode), rs in rows.items():
        for r in rs:
            its, mhz = r.get("iterations_ms") or [], r.get("iter_mhz")
            if not its or max(its) / min(its) - 1 <= STEP or not mhz or len(mhz) != len(its):
                continue
            timed = [i for i, c in enumerate(mhz) if c]     # iterations the clock was sampled in
            if len(timed) < 2:
                continue
            lo, hi = min(timed, key=its.__getitem__), max(timed, key=its.__getitem__)
            print(f"{op:5} {mode:10} call {r['call']}: time {its[lo]:.3f} -> {its[hi]:.3f} ms "
                  f"({its[hi] / its[lo] - 1:+.1%}), SM clock {mhz[lo]:.0f} -> {mhz[hi]:.0f} MHz "
                  f"({mhz[hi] / mhz[lo] - 1:+.1%}), {len(its)} iterations, median {statistics.median(its):.3f}"
                  + ("" if len(its) > 20 else " | time " + " ".join(f"{t:.2f}" for t in its)
                     + " | MHz " + " ".join(f"{c:.0f}" if c else "-" for c in mhz)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="run config(s) merged over config/config.yaml")
    ap.add_argument("--tp", type=int, help="TP size (default: the config's smallest)")
    ap.add_argument("--variant", action="append", default=[],
                    help="setting to measure (default ub.te on te, none on torch); OP=VARIANT sets one op's "
                         "(repeatable), e.g. --variant qkv=ub.te+dgrad.ring --variant proj=ub.te+fprop.ring")
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per call, each building the layer afresh; a call's figure is their median, as "
                         "for a case in a tuning session (min_rounds there)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per call (default: the config's)")
    ap.add_argument("--against", default=None,
                    help="second setting timed in every call for the per-call ratio (default none; '' for no ratio)")
    ap.add_argument("--preroll-ms", type=float, default=None,
                    help="GPU: untimed pre-roll of the op's own work before each batch (default: the config's)")
    ap.add_argument("--window-ms", type=float, default=None,
                    help="GPU: GPU time a GPU-bound op times per batch (default: the config's; 0: --iters only)")
    ap.add_argument("--json", help="write every call's figures here")
    a = ap.parse_args(argv)
    cfg = load_config_files(ROOT / "config" / "config.yaml", *a.config)
    s = resolve_here(cfg, source=", ".join(a.config) or "config/config.yaml", node_tps=[a.tp] if a.tp else None)
    tp = a.tp or s.tp_sizes[0]
    default = next((v for v in a.variant if "=" not in v), "ub.te" if s.backend == "te" else "none")
    per_op = dict(v.split("=", 1) for v in a.variant if "=" in v)
    bad = set(per_op) - set(s.ops)
    if bad:
        ap.error(f"--variant: unknown op(s) {sorted(bad)} (expected {', '.join(s.ops)})")
    variants = {op: per_op.get(op, default) for op in s.ops}
    variant = default if not per_op else ", ".join(f"{op}={v}" for op, v in variants.items())
    against = "none" if a.against is None else a.against
    against = against or None
    launcher = Launcher(s)
    rows: dict[tuple[str, str], list[dict]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tptune-noise-") as tmp:
        for call in range(a.calls):
            for op in s.ops:
                runs = [(variants[op], m) for m in (MODES if call % 2 == 0 else MODES[::-1])]
                if against and against != variants[op]:
                    runs.append((against, "gpu"))
                for k, (v, mode) in enumerate(runs):
                    key = f"{mode}:{v}" if k >= 2 else mode
                    case = make_case(op, tp, v)
                    op_settings = s.op(op).as_dict()
                    timing = dict(op_settings["timing"], mode=mode, min_rounds=a.rounds, max_rounds=a.rounds,
                                  profile_steps=0)
                    if a.iters:
                        timing["iters"] = a.iters
                    if a.preroll_ms is not None:
                        timing["preroll_ms"] = a.preroll_ms
                    if a.window_ms is not None:
                        timing["window_ms"] = a.window_ms
                    op_settings.update(timing=timing, check=False)
                    out = Path(tmp) / f"{op}-{key.replace(':', '-')}-{call}"
                    run = MeasuredPoint.from_dict(launcher.profile(case, s.model, out, op_settings), str(out))
                    if run.status != "ok":
                        print(f"{case.id} {mode} call {call}: {run.status} {run.error}", file=sys.stderr)
                        continue
                    rows.setdefault((op, key), []).append({
                        "call": call, "ms": run.timing["total_ms"].median,
                        "host_ms": run.host_ms, "host_ahead": run.host_ahead,
                        "sm_mhz": (run.clock or {}).get("sm_mhz"),
                        "batches": run.host_batches,
                        "iter_mhz": (run.host_batches[0].get("clock") or {}).get("iter_mhz"),
                        "iterations_ms": list(run.timing["total_ms"].samples)})
    window = (s.timing.window_ms or 0) if a.window_ms is None else a.window_ms
    print(f"{s.model.model.name} TP={tp} {variant}, {a.calls} calls per op and mode, "
          f"{a.rounds} round(s) of {s.timing.iters if not a.iters else a.iters} timed iterations per call"
          f"{f' or {window:.0f} ms of a GPU-bound op' if window else ''} ({time.monotonic() - t0:.0f} s)")
    print(f"{'op':5} {'mode':7} {'median ms':>10} {'spread':>7} {'min':>8} {'max':>8} {'host ms':>8} "
          f"{'host ahead':>10} {'SM MHz':>11} {'cycles spread':>13} {'iters':>5}")
    summary = []
    for op in s.ops:
        for mode in (*MODES, *([f"gpu:{against}"] if against else [])):
            rs = rows.get((op, mode), [])
            xs = [r["ms"] for r in rs]
            if not xs:
                continue
            spread = max(xs) / min(xs) - 1
            host = statistics.median(r["host_ms"] for r in rs)
            ahead = all(r["host_ahead"] for r in rs) if mode.startswith("gpu") else None
            mhz = [r["sm_mhz"] for r in rs if r.get("sm_mhz")]
            cycles = [call_cycles(r) for r in rs if r.get("sm_mhz")]
            cyc_spread = max(cycles) / min(cycles) - 1 if len(cycles) == len(xs) else None
            row = {"op": op, "mode": mode, "median_ms": statistics.median(xs), "spread": spread,
                   "min_ms": min(xs), "max_ms": max(xs), "host_ms": host, "host_ahead": ahead, "calls": len(xs),
                   "sm_mhz_min": min(mhz, default=None), "sm_mhz_max": max(mhz, default=None),
                   "cycles_spread": cyc_spread}
            ref = {r["call"]: r["ms"] for r in rows.get((op, f"gpu:{against}"), [])} if mode == "gpu" else {}
            ratios = [r["ms"] / ref[r["call"]] for r in rs if r["call"] in ref]
            if len(ratios) >= 2:
                row.update(against=against, ratio_median=statistics.median(ratios),
                           ratio_spread=max(ratios) / min(ratios) - 1)
            summary.append(row)
            clock = f"{min(mhz):5.0f}-{max(mhz):5.0f}" if mhz else "–"
            iters = statistics.median(len(r["iterations_ms"]) for r in rs)
            row["iters"] = iters
            print(f"{op:5} {mode:7} {statistics.median(xs):10.3f} {spread:7.1%} {min(xs):8.3f} {max(xs):8.3f} "
                  f"{host:8.3f} {'' if ahead is None else str(ahead):>10} {clock:>11} "
                  f"{'–' if cyc_spread is None else f'{cyc_spread:.1%}':>13} {iters:5.0f}")
    print_steps(rows)
    for row in summary:
        if "ratio_median" in row:
            print(f"{row['op']:5} {variants[row['op']]} / {against} per call: median {row['ratio_median']:.3f}, "
                  f"spread {row['ratio_spread']:.1%} over {row['calls']} calls")
    for mode, name in (("gpu", variant), (f"gpu:{against}", against)):
        gpu = [r for r in summary if r["mode"] == mode and r["median_ms"] >= 1.0]
        worst = max((r["spread"] for r in gpu), default=None)
        if worst is not None:
            print(f"target spread <= 2% for ops >= 1 ms with GPU timing, {name}: worst {worst:.2%} "
                  f"({'met' if worst <= 0.02 else 'NOT met'})")
    if a.json:
        out = {"summary": summary, "calls": {f"{k[0]}/{k[1]}": v for k, v in rows.items()},
               "tp": tp, "variant": variant, "against": against}
        Path(a.json).write_text(json.dumps(_rounded(out), separators=(",", ":")))   # a window is 100s of iterations
    return 0


if __name__ == "__main__":
    sys.exit(main())

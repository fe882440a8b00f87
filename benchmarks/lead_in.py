"""Does the lead-in (timing.lead_in) take away the first timed member's advantage in a session?

A session measures its members in alternating rounds; the first member of round 0 is the first work of
this op on a card that has just been idle (the build, Snakemake between jobs) or ran another op. On the
x2 sessions in results/ that member read 0.5% fast against its own later rounds (401 pairs), on one
H100 2.7% (12 calibration sessions). The lead-in runs that member once, untimed, before round 0.

This runs, per op, sessions of a null pair (no overlap and the bound at TP=1, with the per-rank GEMMs of
``--shard``: the same work) through the tuning harness, alternately with and without the lead-in,
``--reps`` times, with ``--gap-s`` of idle before each session (the workflow's gap between jobs). Per
session, the first member's effect is d0 - mean(d1..): its round-0 log ratio against the other member,
less the same over the later rounds. Printed per arm: the mean effect with its 95% interval over the
sessions (Student), and the per-session values.

  python benchmarks/lead_in.py --config config/gpu/h200x2-llama3-70b.yaml --shard 2 [--reps 3]
      [--rounds 4] [--gap-s 1.0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tptune.cases import make_case
from tptune.measure.launch import Launcher
from tptune.measure.session_spec import SessionSpec
from tptune.records.sessions import read_point
from tptune.stats.rounds import log_ratio_interval, point_rounds
from tptune.cli.calibrate import load_sharded
from tptune.stats.window import first_member_effect
PAIR = ("none", "nocomm")


def summarize(effects: dict[str, list[float]]) -> dict[str, dict]:
    """Per arm: the mean effect as a ratio with its 95% interval (rounds.log_ratio_interval) and n."""
    out = {}
    for arm, vals in effects.items():
        r = log_ratio_interval(vals)
        out[arm] = {"n": len(vals), "effect": r.ratio - 1 if r else None, "lo": r.lo - 1 if r else None,
                    "hi": r.hi - 1 if r else None, "values": vals}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="run config(s) merged over config/config.yaml")
    ap.add_argument("--shard", type=int, default=1)
    ap.add_argument("--ops", default=None, help="comma-separated ops (default: the config's)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gap-s", type=float, default=1.0, help="idle before each session")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.rounds < 3:
        ap.error("--rounds: at least 3 (round 0 against two later rounds)")
    try:
        s, mc, ops = load_sharded(a.config, a.shard, a.ops)
    except ValueError as e:
        raise SystemExit(f"--shard: {e}")
    launcher = Launcher(s)
    effects: dict[str, list[float]] = {"lead-in": [], "none": []}
    sessions = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tptune-lead-in-") as tmp:
        for rep in range(a.reps):
            for op in ops:
                arms = ("lead-in", "none") if (rep + ops.index(op)) % 2 == 0 else ("none", "lead-in")
                for arm in arms:
                    time.sleep(a.gap_s)
                    members = [make_case(op, 1, v) for v in PAIR]
                    op_settings = s.op(op).as_dict()
                    op_settings.update(check=False, timing=dict(op_settings["timing"], min_rounds=a.rounds,
                                                                max_rounds=a.rounds, profile_steps=0,
                                                                lead_in=arm == "lead-in"))
                    sdir = Path(tmp) / f"{op}-{rep}-{arm}"
                    rec = launcher.session(SessionSpec(f"lead-in/{op}/{rep}/{arm}", members, mc, op_settings,
                                                       evidence=False), sdir)
                    vals = {cid: point_rounds(read_point(sdir / p)) for cid, p in rec["runs"].items()}
                    first, second = rec["order"][0][0], rec["order"][0][1]
                    e = first_member_effect(vals[first], vals[second])
                    if e is not None:
                        effects[arm].append(e)
                    sessions.append({"op": op, "rep": rep, "arm": arm, "first": first, "effect": e,
                                     "lead_in": rec.get("lead_in"), "rounds": vals})
    res = summarize(effects)
    print(f"{mc.model.name} TP=1, null pair {' vs '.join(PAIR)}, {a.rounds} rounds, {a.reps} reps x {len(ops)} ops "
          f"per arm, {a.gap_s:g} s idle before each session ({time.monotonic() - t0:.0f} s)")
    print("first member's round-0 effect (its round-0 ratio against the other, over the same in later rounds):")
    for arm, r in res.items():
        if r["n"]:
            ci = f" [{r['lo']:+.2%}, {r['hi']:+.2%}]" if r["n"] >= 2 else ""
            print(f"  {arm:8s} {r['effect']:+.2%}{ci} over {r['n']} sessions: "
                  + " ".join(f"{v * 100:+.1f}" for v in r["values"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": res, "sessions": sessions, "shard": a.shard,
                                            "rounds": a.rounds, "gap_s": a.gap_s}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

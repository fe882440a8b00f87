"""Replay of the committed sessions under issue 26's rules (no GPU): the bound's burn-in, the finalist rule,
the capped efficiency and the pooled block figure. Prints what changes and what stays.

    PYTHONPATH=src python benchmarks/figures_replay.py
"""
from __future__ import annotations

import json
from pathlib import Path

from tptune.records.run_dir import RunDir
from tptune.report.figure_bound import point_sessions
from tptune.records.sessions import load_session, read_point
from tptune.stats import bound, efficiency, host_evidence as host, wording
from tptune.stats.rounds import point_rounds

RESULTS = Path(__file__).resolve().parents[1] / "results"
FLOOR = 0.02


def bound_replay() -> None:
    print("## The bound's first round (burn-in), every committed point session with a bound")
    r = bound.burn_in_replay(point_sessions(RESULTS))
    print(f"{r['sessions']} sessions")
    for k in ("before", "after"):
        a, n = r[k]["above"], r[k]["rounds"]
        print(f"bound reads slower than a setting it bounds, {k} the burn-in: {a} of {n} setting-rounds ({a / n:.0%})")
    for k in ("before", "after"):
        print(f"bound faults (bound / setting paired: interval above 1 or estimate above 1 + margin), {k}: "
              f"{r[k]['faults']}" + "".join(f"\n  {w}" for w in r[k]["where"]))


def finalist_replay() -> None:
    print("\n## Finalist rule: per op, settings faster than the pick beyond the noise, within the margin")
    for d in sorted(RESULTS.glob("**/decisions.json")):
        if "legacy" in d.parts:
            continue
        run = d.parent.relative_to(RESULTS)
        doc = json.loads(d.read_text())
        for op, rec in doc["ops"].items():
            if "finalists" in rec:
                fin = rec["finalists"]
                src = "sessions"
            else:   # runs kept without sessions: the recorded ties (setting / pick) carry the same interval
                fin = [t for t in rec.get("ties") or [] if t.get("hi") is not None and t["hi"] < 1]
                src = "recorded ties"
            if fin:
                best = min(fin, key=lambda f: f["ratio"])
                print(f"{run} {op}: pick {rec['config'].get('variant')} -> {len(fin)} finalist(s) to the block "
                      f"({src}); best {best['case'].split('-', 2)[2]} {best['ratio']:.3f} "
                      f"[{best['lo']:.3f}, {best['hi']:.3f}]")
    print("\n## Finalist rule on the block: does the finalists' (fastest) combination now win?")
    for lf in sorted(RESULTS.glob("**/layer/tp*.json")):
        rec = json.loads(lf.read_text())
        fast = [r for r in rec["settings"] if r["variant"].startswith("ub.fastest_tp")]
        note = "no fastest combination measured (it equalled the tuned one)" if not fast else \
            f"tuned / fastest {fast[0]['tuned_vs']['ratio']['ratio']:.3f} [{fast[0]['tuned_vs']['ratio']['lo']:.3f}, " \
            f"{fast[0]['tuned_vs']['ratio']['hi']:.3f}]"
        print(f"{lf.parent.parent.relative_to(RESULTS)} TP={rec['tp']}: winner {rec['winner'].split('-', 2)[2]} ({note})")


def knobs_figures() -> None:
    print("\n## Knobs run: pooled block figure and capped efficiency")
    k = RunDir(RESULTS / "knobs-llama3-70b-x2")
    doc = json.loads(k.decisions_json.read_text())
    p = doc["meta"]["layer"]["2"]["pooled"]["pooled"]["ub.nvidia_bf16_tp2"]
    print(f"tuned / NVIDIA tp2 preset pooled: {p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}], {p['rounds']} rounds, "
          f"{p['pooled_sessions']} sessions = {wording.speedup(p)}: {wording.classify_ratio(p, FLOOR)}")
    for s in p["sessions"]:
        print(f"  {s['session']}: {s['ratio']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}], {s['rounds']} rounds: "
              f"{wording.classify_ratio(s, FLOOR)}")
    m = efficiency.Efficiency.from_dict(doc["meta"]["model_efficiency"])
    print(f"summed ops, capped at their bounds, after the burn-in: {m.shown()} of {m.exposed_ms:.3f} ms exposed")
    # the same without the burn-in, for comparison with the README's median figure (81%)
    triples = {}
    for op, rec in doc["ops"].items():
        runs = {c: p.slim() for c, p in load_session(k.point_session(op, 2)).points.items()}
        none = next(p for c, p in runs.items() if c.endswith("-none"))
        b = next(p for c, p in runs.items() if bound.is_bound(c))
        triples[op] = (none, runs[rec["winner"]["case"]], b)
    m0 = efficiency.model_efficiency(triples)
    print(f"the same with the bound's first round kept: {m0.shown()} of {m0.exposed_ms:.3f} ms exposed")


def block_host() -> None:
    print("\n## Block batches: host-ahead evidence")
    for sj in sorted(RESULTS.glob("**/sessions/layer/tp*/session.json")):
        s = json.loads(sj.read_text())
        tot = {"batches": 0, "failed": 0, "unproven": 0, "attempts": 0}
        for p in s["runs"].values():
            f = sj.parent / p
            if f.exists():
                h = host.summary(read_point(f))
                for k in tot:
                    tot[k] += h[k]
        print(f"{sj.parent.relative_to(RESULTS)}: {tot['batches']} batches, {tot['failed']} not host-ahead after "
              f"every attempt ({tot['attempts']} attempts), {tot['unproven']} queue verdicts without their figures")


if __name__ == "__main__":
    bound_replay()
    finalist_replay()
    knobs_figures()
    block_host()

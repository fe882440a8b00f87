"""Which knob groups the committed knob runs moved, what the default-groups rule derives from them, and what
round budget their sessions used: the evidence behind the te backend's default knob search
(tptune.te.methods.PROVEN_GROUPS, read from tptune/data/knob_groups.json; config/config.yaml's backend defaults).

For every ``results/**/search/<op>/tp<N>/knobs/result.json`` it reads the search's ``changes`` (one per
knob group session: whether the kept value moved away from the starting setting beyond the step margin,
and how). A moved group counts as **in the written file** where the run's written ``ub_cfgs`` at that TP
(``ub_cfgs.tp<N>.json``) holds the moved-to value for that GEMM. For every knob-step ``session.json``
it reads the rounds used and how the session stopped, so the round budget is read off too.

    python benchmarks/knob_evidence.py [results] [--write]   # --write: src/tptune/data/knob_groups.json

The default groups come from a stated rule (tptune.search.knob_rule): each group's kept / incumbent ratios
pooled over every session that searched it, in the default when the pooled 95% interval lies entirely below
1 - the step margin. The script prints each group's pooled ratio, the groups the rule keeps (also at half and
twice the effect, to show how much the answer leans on it), and whether the committed record says the same;
tests/search/test_knob_rule.py holds the record to the rule over results/.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.search.knob_rule import EFFECT, RECORD, committed, derive_from, describe, group_blocks  # noqa: E402
from tptune.te.methods import ALL_GROUPS, PROVEN_GROUPS  # noqa: E402

_DIFF = re.compile(r"(?P<gemm>\w+_(fprop|dgrad|wgrad))\.(?P<knob>\w+) (?P<old>\S+)\u2192(?P<new>\S+)")


def _written(run: Path, tp: int) -> dict | None:
    f = run / f"ub_cfgs.tp{tp}.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except ValueError:
        return None


def _in_written(diff: list[str], written: dict | None) -> bool | None:
    """Whether every knob change of ``diff`` is what the written file holds (None: no written file)."""
    if written is None:
        return None
    cfgs = written.get("ub_cfgs", written)
    seen = False
    for d in diff:
        m = _DIFF.fullmatch(d)
        if m:
            seen = True
            entry = cfgs.get(m["gemm"]) or {}
            if str(entry.get(m["knob"])) != m["new"]:
                return False
        elif d.endswith("overlap dropped"):     # rs_dgrad: the wgrad is no longer overlapped
            seen = True
            if d.split()[0] in cfgs:
                return False
    return seen


def group_evidence(results: Path) -> dict[str, dict]:
    """Per knob group: sessions, moved, moved into the written file, and where (run, op, TP)."""
    out: dict[str, dict] = {g: {"sessions": 0, "moved": 0, "written": 0, "where": []}
                            for g in ALL_GROUPS}
    for f in sorted(results.glob("**/search/*/tp*/knobs/result.json")):
        r = json.loads(f.read_text())
        run = f.parents[4]
        for ch in r.get("changes") or []:
            g = out.setdefault(ch["group"], {"sessions": 0, "moved": 0, "written": 0, "where": []})
            g["sessions"] += 1
            if ch.get("moved"):
                g["moved"] += 1
                w = _in_written(ch.get("diff") or [], _written(run, r["tp"]))
                g["written"] += bool(w)
                g["where"].append((str(run.relative_to(results)), r["op"], r["tp"], ch.get("kept_ratio"), w))
    return out


def round_evidence(results: Path) -> dict:
    """Knob-step sessions: rounds used, and of those that resolved a comparison, at which round."""
    used = collections.Counter()
    resolved_at = collections.Counter()
    budget = collections.Counter()
    for f in results.glob("**/sessions/*/tp*/knobs/step*/session.json"):
        s = json.loads(f.read_text())
        used[s.get("rounds")] += 1
        budget[(s.get("min_rounds"), s.get("max_rounds"))] += 1
        m = re.match(r"resolved after (\d+) rounds", s.get("stop") or "")
        if m:
            resolved_at[int(m[1])] += 1
    return {"rounds_used": dict(sorted(used.items(), key=lambda kv: (kv[0] is None, kv[0]))),
            "resolved_at": dict(sorted(resolved_at.items())), "budgets": dict(budget)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(ROOT / "results"))
    ap.add_argument("--write", action="store_true", help=f"write src/tptune/data/{RECORD}")
    a = ap.parse_args(argv)
    results = Path(a.results)
    ev = group_evidence(results)
    print(f"{'group':32} {'sessions':>8} {'moved':>6} {'in file':>8}")
    for g in ALL_GROUPS:
        e = ev[g]
        print(f"{g:32} {e['sessions']:>8} {e['moved']:>6} {e['written']:>8}")
    for g in ALL_GROUPS:
        for run, op, tp, ratio, w in ev[g]["where"]:
            print(f"  {g}: {run} {op} TP {tp}: kept / start {ratio}, in the written file: {w}")
    rounds = round_evidence(results)
    print(f"knob steps, rounds used: {rounds['rounds_used']}")
    print(f"knob steps resolved at round: {rounds['resolved_at']}")
    print(f"(min_rounds, max_rounds) of those sessions: {rounds['budgets']}")
    blocks = group_blocks(results)   # every knob session read once, for the rule at each effect
    rec = derive_from(blocks)
    print(f"the rule (tptune.search.knob_rule), over {rec['runs']} runs with a knob search: kept / incumbent pooled "
          f"per group, in the default where its interval lies below {1 - EFFECT:.2f}:")
    for g in ALL_GROUPS:
        print(f"  {describe(g, rec['groups'][g])}{'  <- default' if rec['groups'][g]['default'] else ''}")
    for e in (EFFECT / 2, EFFECT * 2):
        print(f"  at an effect of {e:.1%} the rule would keep {derive_from(blocks, e)['default']}")
    print(f"the rule's default groups:          {rec['default']}")
    print(f"tptune.te.methods.PROVEN_GROUPS:      {list(PROVEN_GROUPS)}  (tptune/data/{RECORD})"
          + ("" if rec == committed() else f"   <- the committed record differs: python {Path(__file__).name} --write"))
    if a.write:
        out = ROOT / "src" / "tptune" / "data" / RECORD
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

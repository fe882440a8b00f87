"""The ``burn_in`` figure kind (report.quoted_figures): what leaving the bound's first round out changes over
every committed point session with a bound (stats.bound.burn_in_replay; benchmarks/figures_replay.py prints
the same): sessions, and per side (before: with the first round, after: without it) above_<side> of
rounds_<side> setting-rounds where the bound reads slower than a setting it bounds, share_<side> (their
quotient) and faults_<side> (bound faults against any setting). ``runs:`` (folders under results/) narrows it.

The ``ops_hidden`` kind: the share of the exposed communication run ``run``'s chosen settings hide, the ops
summed (stats.efficiency.model_efficiency over each op's TP-point session at its decided TP, as decisions.json's
meta.model_efficiency), with ``burn_in: keep`` the bound's first round kept (a figure as first measured, beside
the corrected one): hidden (as reports print it), value lo hi rounds.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.stats.bound import burn_in_replay, burned_in, is_bound
from tptune.stats.efficiency import model_efficiency

POINT_SESSIONS = "**/sessions/*/tp*/point/session.json"


def run_roots(results: Path, runs: list[str] | None) -> list[Path]:
    """The folders ``runs`` under ``results`` (every one must be there), or ``results`` itself without them."""
    roots = [results / r for r in runs] if runs else [results]
    for root in roots:
        if not root.is_dir():
            raise ValueError(f"runs: no folder {root.relative_to(results)!s} under results/")
    return roots


def point_sessions(results: Path, runs: list[str] | None = None):
    """(name, {case id: point}) of every point session under ``results`` (or under its folders ``runs``)."""
    for root in run_roots(results, runs):
        for sj in sorted(root.glob(POINT_SESSIONS)):
            yield str(sj.parent.relative_to(results)), load_session(sj.parent, strict=False).points


def burn_in_figure(results: Path, d: dict) -> dict:
    """The fields of a ``burn_in`` figure (module doc)."""
    return dict(_burn_in(Path(results), tuple(d.get("runs") or ())))


@functools.lru_cache(maxsize=8)     # several figures quote one replay of the same tree
def _burn_in(results: Path, runs: tuple[str, ...]) -> dict:
    r = burn_in_replay(point_sessions(results, list(runs) or None))
    out = {"sessions": r["sessions"]}
    for side in ("before", "after"):
        s = r[side]
        out.update({f"above_{side}": s["above"], f"rounds_{side}": s["rounds"], f"faults_{side}": s["faults"],
                    f"share_{side}": s["above"] / s["rounds"] if s["rounds"] else 0.0})
    return out


def ops_hidden_figure(results: Path, d: dict) -> dict:
    """The fields of an ``ops_hidden`` figure (module doc)."""
    run = RunDir(results / d["run"])
    keep = d.get("burn_in") == "keep"
    triples = {}
    for op, rec in json.loads(run.decisions_json.read_text())["ops"].items():
        # at the op's decided TP, else its smallest measured one (decide.summary.summed_efficiency's rule)
        measured = sorted(int(p.parent.parent.name[2:]) for p in run.sessions.glob(f"{op}/tp*/point/session.json"))
        if not measured:
            raise ValueError(f"{d['run']}: no TP-point session of {op}")
        tp = rec["tp"] if rec["tp"] in measured else measured[0]
        pts = load_session(run.point_session(op, tp), strict=False).points
        bound = next((p for c, p in pts.items() if is_bound(c)), None)
        winner = pts.get((rec.get("winner") or {}).get("case"))
        triples[op] = (pts.get(f"{op}-tp{tp}-none"), winner, bound if keep else burned_in(bound))
    e = model_efficiency(triples)
    return {"hidden": e.shown(), "value": e.value, "lo": e.lo, "hi": e.hi, "rounds": e.rounds}

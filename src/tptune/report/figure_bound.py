"""The ``burn_in`` figure kind (report.quoted_figures): what leaving the bound's first round out changes over
every committed point session with a bound (stats.bound.burn_in_replay; benchmarks/figures_replay.py prints
the same): sessions, and per side (before: with the first round, after: without it) above_<side> of
rounds_<side> setting-rounds where the bound reads slower than a setting it bounds, share_<side> (their
quotient) and faults_<side> (bound faults against any setting). ``runs:`` (folders under results/) narrows it.
"""
from __future__ import annotations

from pathlib import Path

from tptune.records.sessions import load_session
from tptune.stats.bound import burn_in_replay

POINT_SESSIONS = "**/sessions/*/tp*/point/session.json"


def point_sessions(results: Path, runs: list[str] | None = None):
    """(name, {case id: point}) of every point session under ``results`` (or under its folders ``runs``)."""
    roots = [results / r for r in runs] if runs else [results]
    for root in roots:
        if not root.is_dir():
            raise ValueError(f"runs: no folder {root.relative_to(results)!s} under results/")
        for sj in sorted(root.glob(POINT_SESSIONS)):
            yield str(sj.parent.relative_to(results)), load_session(sj.parent, strict=False).points


def burn_in_figure(results: Path, d: dict) -> dict:
    """The fields of a ``burn_in`` figure (module doc)."""
    r = burn_in_replay(point_sessions(results, d.get("runs")))
    out = {"sessions": r["sessions"]}
    for side in ("before", "after"):
        s = r[side]
        out.update({f"above_{side}": s["above"], f"rounds_{side}": s["rounds"], f"faults_{side}": s["faults"],
                    f"share_{side}": s["above"] / s["rounds"] if s["rounds"] else 0.0})
    return out

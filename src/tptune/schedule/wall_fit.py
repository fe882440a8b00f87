"""The committed table a wall-time prediction costs sessions with before anything is measured
(``tptune/data/wall_fit.json``), and the fit that derives it from committed runs (benchmarks/wall_fit.py
prints it and writes the table; tests check the table is that fit of results/).

Only runs whose wall_s.txt covers their sessions are fitted (a run whose sessions span more than its
wall_s.txt was measured by more than one invocation). Fitted, per session kind (steps, points, blocks) and
TP: the median seconds per member-round (a member measured once in a session's round, group start left
out) and the median share of the round budget (max_rounds) a session used; and over all runs: the median
worker-group start, the median bookkeeping wait per edge kind (schedule.measured.EDGES), and the median
time outside the sessions' span (start-up and tail; a confirm stage the run's workflow ran is left out of
it). And the confirm stage's launches (tptune.confirm), from every committed confirm.json: the median
start-up of a launch (its wall time less its logged iterations) and the median iteration.
"""
from __future__ import annotations

import json
import statistics
from importlib import resources
from pathlib import Path

from tptune.records.progress import confirm_in_wall_s, measured_wall_s
from tptune.errors import TptuneError
from tptune.records.run_dir import RunDir
from tptune.schedule import measured as ms

KINDS = ("steps", "points", "blocks")
TABLE = "wall_fit.json"


def load_table() -> dict:
    """The committed fit (module doc)."""
    try:
        return json.loads(resources.files("tptune").joinpath("data", TABLE).read_text())
    except (OSError, ValueError) as exc:
        raise TptuneError(f"tptune/data/{TABLE}: the committed wall-time fit cannot be read ({exc}): "
                          "python benchmarks/wall_fit.py --write derives it from results/") from None


def fitted_runs(results: Path) -> tuple[list[tuple[RunDir, list[ms.MeasuredSession], float]], list[str]]:
    """(run, its sessions, wall_s) of every run under ``results`` with wall_s.txt whose sessions it
    covers, and one line per run left out saying why."""
    used, skipped = [], []
    for wall_txt in sorted(Path(results).glob("**/wall_s.txt")):
        run = RunDir(wall_txt.parent)
        wall = measured_wall_s(run)
        rel = wall_txt.parent.relative_to(results).as_posix()
        try:
            sessions = ms.read_sessions(run)
        except TptuneError as exc:
            skipped.append(f"{rel}: " + str(exc).replace(f"{wall_txt.parent}/", ""))
            continue
        if wall is None:
            skipped.append(f"{rel}: wall_s.txt holds no number")
        elif ms.span(sessions) > wall:
            skipped.append(f"{rel}: its sessions span {ms.span(sessions):.0f} s, more than wall_s.txt's "
                           f"{wall:.0f} s (measured by more than one invocation)")
        else:
            used.append((run, sessions, wall))
    return used, skipped


def _max_rounds(run: RunDir, name: str) -> int | None:
    rec = json.loads((run.sessions / name / "session.json").read_text())
    return rec.get("max_rounds")


def confirm_fit(results: Path) -> dict | None:
    """A confirm launch's cost from every committed confirm.json's launches that ran (module doc)."""
    starts, iters, runs = [], [], []
    for path in sorted(Path(results).glob("**/confirm.json")):
        rec = json.loads(path.read_text())
        ok = [x for x in rec.get("launches") or [] if x.get("status") == "ok" and x.get("iterations")]
        for x in ok:
            starts.append(x["wall_s"] - sum(i["ms"] for i in x["iterations"]) / 1000)
            iters.append(x["median_ms"] / 1000)
        if ok:
            runs.append(path.parent.relative_to(results).as_posix())
    if not starts:
        return None
    return {"runs": runs, "launches": len(starts), "launch_start_s": round(statistics.median(starts), 3),
            "iteration_s": round(statistics.median(iters), 4)}


def fit(results: Path) -> dict:
    """The table (module doc) from the runs under ``results``."""
    used, skipped = fitted_runs(results)
    if not used:
        raise TptuneError(f"{results}: no run with wall_s.txt and sessions it covers to fit")
    starts, outside = [], []
    waits: dict[str, list[float]] = {k: [] for k in ms.EDGES}
    per_mr: dict[tuple[str, int], list[float]] = {}
    share: dict[str, list[float]] = {k: [] for k in KINDS}
    for run, sessions, wall in used:
        cfg = ms.run_config(run)
        starts += [x.start_s for x in sessions if x.group_starts and x.start_s]
        outside.append(wall - ms.span(sessions) - confirm_in_wall_s(run))
        g = ms.gaps(sessions, int(cfg.get("gpus_per_node") or 8))
        for k in ms.EDGES:
            waits[k] += g.waits[k]
        for x in sessions:
            if x.member_rounds and (not x.group_starts or x.start_s is not None):
                per_mr.setdefault((x.kind, x.tp), []).append((x.held_s - (x.start_s or 0.0)) / x.member_rounds)
            budget = _max_rounds(run, x.name)
            if budget:
                share[x.kind].append(x.rounds / budget)
    r3 = lambda v: round(float(v), 3)  # noqa: E731
    return {
        "about": "tptune.schedule.wall_fit: fitted by benchmarks/wall_fit.py from the committed runs below",
        "runs": [run.root.relative_to(results).as_posix() for run, _, _ in used],
        "left_out": skipped,
        "group_start_s": r3(statistics.median(starts)),
        "gaps_s": {k: r3(statistics.median(v)) if v else 0.0 for k, v in waits.items()},
        "outside_s": r3(statistics.median(outside)),
        "member_round_s": {kind: {str(tp): r3(statistics.median(v)) for (k, tp), v in sorted(per_mr.items())
                                  if k == kind} for kind in KINDS},
        "rounds_share": {k: r3(statistics.median(v)) for k, v in share.items() if v},
        "sessions": sum(len(s) for _, s, _ in used),
        "confirm": confirm_fit(results),
    }


def member_round_s(table: dict, kind: str, tp: int) -> tuple[float, str]:
    """Seconds per member-round of ``kind`` at ``tp``: the table's, or from its two nearest TPs scaled
    per doubling (one TP fitted: that one), with how it was had."""
    fitted = {int(t): v for t, v in table["member_round_s"][kind].items()}
    if tp in fitted:
        return fitted[tp], "fitted"
    tps = sorted(fitted)
    if len(tps) == 1:
        return fitted[tps[0]], f"TP {tps[0]}'s"
    lo, hi = (tps[-2], tps[-1]) if tp > tps[-1] else (tps[0], tps[1])
    per = fitted[hi] / fitted[lo]
    steps = 0
    t = hi if tp > hi else lo
    while t != tp:
        t, steps = (t * 2, steps + 1) if tp > t else (t // 2, steps - 1)
    base = fitted[hi] if tp > hi else fitted[lo]
    return base * per ** steps, f"TP {lo} -> {hi} scaling"

"""Re-derive a finished run's searches, TP points, decisions, configs and report from its recorded
sessions with this checkout's decision code: no GPU, nothing measured. A search whose new decisions
would have measured something the run did not is reported, not guessed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tptune.errors import TptuneError


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))


def check_recorded(run_dir: Path) -> None:
    """Refuse, clearly, a run recorded before side-by-side sessions (nothing here can replay it)."""
    if not (Path(run_dir) / "sessions").is_dir():
        raise TptuneError(f"{run_dir}: no sessions/ folder: this run was recorded before side-by-side "
                          "sessions and cannot be re-derived with this code; re-measure it")


def _analysed(run_dir: Path, session_json: Path) -> None:
    from tptune.decide.analyze import analyze_session, session_analysis_path

    ap = session_analysis_path(run_dir, session_json)
    if not ap.exists():
        analyze_session(session_json.parent, ap)


def rederive(s, run_dir: Path) -> list[str]:
    from tptune.decide.analyze import collect
    from tptune.decide.answer import decide
    from tptune.decide.tp import tp_step
    from tptune.decide.points import tp_point, with_verdict
    from tptune.records.sessions import session_dir, step_session_name
    from tptune.report.render import render_report
    from tptune.search.steps import dimensions, step_record

    run_dir = Path(run_dir)
    check_recorded(run_dir)
    notes, finals = [], []
    sessions = []   # as the workflow's collect takes them (rules/common.smk all_sessions): per op, TP, search, step; then the point
    for op in s.ops:
        points = {}
        for tp_dir in sorted((run_dir / "search" / op).glob("tp*"), key=lambda d: int(d.name[2:])):
            tp = int(tp_dir.name[2:])
            results = []
            for dim in dimensions(s, op, tp):
                prev, step = None, 0
                while True:
                    recorded = tp_dir / dim / f"step{step}.json"
                    if not recorded.exists():
                        raise TptuneError(f"{op} TP={tp} {dim}: the new decisions need step {step}, which the "
                                          "run did not measure; re-measure this run")
                    old = json.loads(recorded.read_text())
                    rec = step_record(s, op, tp, dim, step, prev, run_dir)
                    if rec["sessions"] != old["sessions"][:len(rec["sessions"])]:
                        raise TptuneError(f"{op} TP={tp} {dim} step {step}: the new decisions measure "
                                          f"{rec['sessions'][-1]['values']}, the run measured other points")
                    if rec.get("best") != old.get("best"):
                        notes.append(f"{op} TP={tp} {dim}: best {old.get('best')} -> {rec.get('best')}")
                    _write(recorded, rec)
                    if any(e["step"] == step for e in rec["sessions"]):
                        sessions.append(session_dir(run_dir, op, tp, step_session_name(dim, step)) / "session.json")
                    if rec["done"]:
                        break
                    prev, step = rec, step + 1
                _write(tp_dir / dim / "result.json", rec)
                results.append(rec)
            _write(tp_dir / "results.json", results)
            pt = tp_point(s, op, tp, run_dir)
            _write(tp_dir / "point.json", pt)
            sessions.append(session_dir(run_dir, op, tp, "point") / "session.json")
            _analysed(run_dir, sessions[-1])          # the trace verdict reads the point's analysis
            points[tp] = with_verdict(run_dir, pt)   # as the workflow's tp_step reads them (cli.cmd_tp_step)
            dec = tp_step(s, op, tp, dict(points), run_dir)
            _write(tp_dir / "decision.json", dec)
            final = tp_dir / "decision.json"
        shutil.copy(final, run_dir / "search" / op / "final.json")
        finals.append(run_dir / "search" / op / "final.json")
    for sj in sessions:
        _analysed(run_dir, sj)
    collect(run_dir, sessions, run_dir / "measurements.parquet")
    from tptune.decide.layer import layer_record, write_layer
    for lf in sorted((run_dir / "layer").glob("tp*.json")):   # the block measured the recorded tuned preset
        old = json.loads(lf.read_text())
        rec = layer_record(s, old["tp"], run_dir, old["tuned"])
        if rec["winner"] != old.get("winner"):
            notes.append(f"layer TP={old['tp']}: block winner {old.get('winner')} -> {rec['winner']}")
        write_layer(lf, rec)
    decide(s, run_dir, finals)
    render_report(s, run_dir, run_dir / "report.md")
    return notes

"""The report's wall-time line: the run's measured wall time beside its prediction (records.progress reads
the files). Measured: wall_s.txt where whoever ran snakemake timed it (scripts/device_workflow.sh), else
the progress record's span, each invocation from its start to its last session's end (the jobs after the
last session, the report among them, are outside it). Predicted: wall_predicted.json (before measuring,
on this node) and, where present, wall_s.8gpu-predicted.txt (tptune predict: labelled an extrapolation where the
run measured two TPs below 8, so TP 8 was extrapolated from them). A missing file is named, never an error. Where
a measuring job waited for the shared worker pool, the line says how long, waits behind the run's own jobs
apart from another run's (measure.gpupool records who held it). Where the
run's workflow ran the confirm stage (config.json's confirm.enabled, confirm.json's wall_s), the line says how
much of the measured time it took, and a prediction that did not count it (no confirm_s: written before the
plan counted the stage) is compared with the measured time less the stage."""
from __future__ import annotations

from tptune.records import progress
from tptune.records.run_dir import RunDir


def _s(x: float) -> str:
    return f"{x:.0f} s"


def measured(run: RunDir) -> tuple[float | None, str]:
    """(seconds, where they come from), or (None, what is missing)."""
    wall = progress.measured_wall_s(run)
    if wall is not None:
        return wall, "`wall_s.txt`"
    spans = [(inv.last_finished - inv.earliest) for inv in progress.invocations(progress.read_events(run.progress_jsonl))
             if inv.earliest is not None and inv.last_finished is not None]
    if not spans:
        return None, "not recorded (no `wall_s.txt`, no session in `progress.jsonl`)"
    how = ("from the run's start to its last session's end" if len(spans) == 1 else
           f"over {len(spans)} snakemake invocations, each from its start to its last session's end")
    return sum(spans), f"`progress.jsonl`, {how}; the jobs after that not counted"


def pool_wait(sessions: list[dict], by: str | None = None) -> tuple[float, int]:
    """(seconds, sessions) the measuring jobs waited for the shared worker pool before a session began
    (session.json "held": waited_for_pool_s, measure.gpupool; a session recorded before it: none). ``by``:
    only the waits whose holders were those ("own": the run's own measuring jobs alone, "others": any other;
    a wait recorded before its holders were: others), None: every wait."""
    waits = []
    for x in sessions:
        held = x.get("held") or {}
        w = held.get("waited_for_pool_s")
        if not isinstance(w, (int, float)) or w <= 0:
            continue
        own = held.get("pool_held_by") == "own"
        if by is None or (by == "own") == own:
            waits.append(float(w))
    return sum(waits), len(waits)


def wall_time_line(run: RunDir, sessions: list[dict] = ()) -> str:
    """The line (module doc); ``sessions``: the run's session.json records, for the waits on the pool."""
    wall, source = measured(run)
    parts = [f"measured {_s(wall)} ({source})" if wall is not None else f"measured: {source}"]
    own, n_own = pool_wait(list(sessions), "own")
    if own >= 1.0:
        parts.append(f"of which the measuring jobs waited {_s(own)} for the run's own measuring jobs ({n_own} "
                     "session(s): more of them at once than the worker pool's GPUs or cores hold), part of "
                     "this run's own schedule")
    waited, n = pool_wait(list(sessions), "others")
    if waited >= 1.0:
        parts.append(f"of which the measuring jobs waited {_s(waited)} for the shared worker pool ({n} "
                     "session(s); `launcher.pool_dir`: another run, a test run or a leftover job held its "
                     "GPUs or cores), time this run's own measuring did not take")
    stage = progress.confirm_in_wall_s(run) if wall is not None else 0.0
    if stage:
        parts.append(f"of which the confirm stage {_s(stage)} (`confirm.json`)")
    pred = progress.prediction(run)
    if pred is None:
        parts.append("predicted: no `wall_predicted.json`")
    else:
        on = f" on {pred.gpus} {pred.unit}" if pred.gpus else ""
        ratio = f", measured / predicted {wall / pred.wall_s:.2f}" if wall is not None else ""
        if stage and not pred.confirm_s:
            on += " without the confirm stage (the prediction did not count it)"
            ratio = f", measured less the stage / predicted {(wall - stage) / pred.wall_s:.2f}"
        basis = f": {pred.basis[:200]}" if pred.basis else ""
        parts.append(f"predicted {_s(pred.wall_s)}{on}{ratio} (`wall_predicted.json`{basis})")
    node8 = progress.predicted_8gpu_wall_s(run)
    if node8 is not None:
        tps = sorted({x["tp"] for x in sessions if isinstance(x.get("tp"), int)})
        if len(tps) >= 2 and tps[-1] < 8:   # tptune predict's TPs: the doublings above two measured (schedule.replay)
            parts.append(f"an 8-GPU node {_s(node8)} (`wall_s.8gpu-predicted.txt`), an extrapolation: TP 8 was not "
                         f"measured, its sessions are TP {tps[-1]}'s scaled by each op's TP {tps[-1]} / TP {tps[-2]} "
                         "ratio (`tptune predict` prints them)")
        else:
            parts.append(f"an 8-GPU node predicted {_s(node8)} (`wall_s.8gpu-predicted.txt`: this run's sessions laid "
                         "on 8 GPUs, not measured)")
    return "**Wall time**: " + "; ".join(parts) + "."

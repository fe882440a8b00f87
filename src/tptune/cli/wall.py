"""The run's wall time on paper (docs/wall-time.md): ``tptune predict`` replays a measured run's sessions
onto a node of G GPUs (schedule.replay; a TP above those measured is an extrapolation, and it says so) and writes
wall_s.<G>gpu-predicted.txt beside wall_s.txt; ``tptune
plan`` predicts the run's wall time on its node before anything is measured (schedule.plan_estimate) and
writes wall_predicted.json."""
from __future__ import annotations

import sys

from tptune.emit.records import write_record
from tptune.errors import TptuneError
from tptune.records.files import write_text_atomic
from tptune.records.run_dir import RunDir


def add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="a measured run's wall time on a node of --gpus GPUs, its sessions replayed; "
                                       "a TP above those measured is extrapolated, and the output says so (writes "
                                       "wall_s.<G>gpu-predicted.txt in the run folder)")
    p.add_argument("run_dir", help="a run folder, outputs/<run>, with its sessions")
    p.add_argument("--gpus", type=int, help="GPUs of the node (default: the run's gpus_per_node)")
    p.add_argument("--tp-sizes", type=_tp_list, help="e.g. 2,4,8 (default: the run's TPs, and with two or more "
                                                     "measured the doublings above them that fit --gpus)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.set_defaults(fn=cmd_predict)


def _tp_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TptuneError(f"--tp-sizes {text!r}: expected TP sizes separated by commas, e.g. 2,4,8") from None


def cmd_predict(a) -> int:
    from tptune.schedule.replay import predict

    run = RunDir(a.run_dir)
    if not run.config_json.is_file():
        raise TptuneError(f"{run}: not a run folder (no config.json in it)")
    if a.gpus is not None and a.gpus < 1:
        raise TptuneError(f"--gpus {a.gpus}: expected a number of GPUs, at least 1")
    p = predict(run, a.gpus, a.tp_sizes)
    for line in p.lines():
        print(line)
    if not a.no_write:
        out = run.wall_predicted_txt(p.gpus)
        write_text_atomic(out, f"{round(p.predicted_wall_s)}\n")
        print(f"wrote {out}")
    return 0


def pool_size(s) -> int:
    """What the run measures on here: the node's gpus_per_node GPUs, or on CPU the worker pool's slots (the
    cores this process may run on, at most launcher.cpu_slots: measure.gpupool.cpu_slot_ids, the launcher's)."""
    from tptune.measure.gpupool import cpu_slot_ids

    return int(s.gpus_per_node) if s.device == "cuda" else len(cpu_slot_ids(s.launcher.cpu_slots))


def write_plan_estimate(s, run: RunDir) -> dict | None:
    """wall_predicted.json for ``s`` on its node, and one line saying it; never fails the plan: what
    goes wrong is said on stderr and nothing is written."""
    try:
        from tptune.schedule.plan_estimate import estimate

        est = estimate(s, pool_size(s))
        rec = est.as_record()
        write_record(run.wall_predicted_json, rec)
    except Exception as exc:  # noqa: BLE001 - a prediction never stops a run
        print(f"tptune plan: no wall-time prediction ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    print(f"tptune plan: {est.line()}")
    return rec


def measured_already(s, names) -> set[str]:
    """The sessions among ``names`` the run's folder holds finished (session.json) with the measurement settings
    the run config gives them now (search.measurement.settings_unchanged): what a rerun keeps."""
    from tptune.records.load import read_json
    from tptune.records.run_dir import SESSION_JSON, is_packed_session
    from tptune.search import packed
    from tptune.search.measurement import settings_unchanged

    run = RunDir.of_run(s.run)
    out = set()
    for name in names:
        try:
            rec = read_json(run.sessions / name / SESSION_JSON)
        except (OSError, ValueError):
            continue
        same = packed.settings_unchanged if is_packed_session(name) else settings_unchanged
        if isinstance(rec, dict) and same(s, name, rec.get("settings")):
            out.add(name)
    return out


def dry_run_line(s) -> str:
    """The line ``snakemake -n`` prints (rules/plan.smk): the run's predicted wall time on its node for what is
    left to measure (sessions already measured with today's settings left out), or why there is none. Never
    raises."""
    try:
        from tptune.schedule.plan_estimate import estimate, load_table, planned_sessions

        table = load_table()
        done = measured_already(s, [x.name for x in planned_sessions(s, table)[1]])
        return (f"tptune: {estimate(s, pool_size(s), table, done).line()} "
                "(tptune plan writes it to wall_predicted.json)")
    except Exception as exc:  # noqa: BLE001 - a prediction never stops planning
        return f"tptune: no wall-time prediction ({type(exc).__name__}: {exc})"

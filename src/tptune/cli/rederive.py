"""Re-derive a finished run's searches, TP points, decisions, configs and report from its recorded
sessions with this checkout's decision code: no GPU, nothing measured. A search whose new decisions
would have measured something the run did not is reported, not guessed."""
from __future__ import annotations

from pathlib import Path

from tptune.cli.stages import analyze_session, answer, collect
from tptune.confirm.stage import rederive_confirm
from tptune.cases import make_case
from tptune.decide.layer import layer_record, torch_block_choice
from tptune.decide.tp import memory_floor, tp_step
from tptune.decide.tp_point import tp_point, with_verdict
from tptune.emit.records import write_record
from tptune.errors import TptuneError
from tptune.records import load
from tptune.records.run_dir import SESSION_JSON, RunDir
from tptune.records.sessions import load_session, recorded_gpu_memory
from tptune.report.render import render_report
from tptune.search.steps import dimensions, step_record

def check_recorded(run: RunDir) -> None:
    """Refuse, clearly, a run recorded before side-by-side sessions (nothing here can replay it)."""
    if not run.sessions.is_dir():
        raise TptuneError(f"{run}: no sessions/ folder: this run was recorded before side-by-side "
                          "sessions and cannot be re-derived with this code; re-measure it")


def check_finished(s, run: RunDir) -> None:
    """Refuse, naming what is missing, a run cut before every op's search and TP point were recorded:
    re-deriving replays recorded sessions and has none to replay there."""
    for op in s.ops:
        tps = run.searched_tps(op)
        if not tps:
            raise TptuneError(f"{run}: {op} has no search step recorded ({run.search / op} is missing or empty): "
                              "the run was cut before its first search step, so there is nothing to re-derive; "
                              "finish it with snakemake (the same --configfile), which measures from where it "
                              "stopped")
        for tp in tps:
            if not (run.point_session(op, tp) / SESSION_JSON).is_file():
                raise TptuneError(f"{run}: {op} TP={tp} has no TP point session recorded "
                                  f"({run.point_session(op, tp) / SESSION_JSON} is missing): the run was cut before "
                                  "it; finish it with snakemake (the same --configfile), then re-derive")


def _analysed(run: RunDir, session_json: Path) -> None:
    ap = run.session_analysis(session_json.parent)
    if not ap.exists():
        analyze_session(session_json.parent, ap)


def _tuned(s, run: RunDir, old: dict, block) -> str:
    """The block member that stands for the per-op choices: te's is the recorded tuned preset; torch's is
    read again from the re-derived TP points (decide.layer.torch_block_choice: ``none`` where every op chose
    no overlap), where the block measured it, since which member that is changes none of the block's cases."""
    if s.backend != "torch":
        return old["tuned"]
    _, variant = torch_block_choice({op: load.tp_point(run, op, old["tp"]) for op in s.ops},
                                    s.decision.noise_floor)
    case = make_case("layer", old["tp"], variant).id
    return case if case in block.points else old["tuned"]


def rederive(s, run: RunDir) -> list[str]:
    check_recorded(run)
    check_finished(s, run)
    notes, finals = [], []
    sessions = []   # as the workflow's collect takes them (rules/common.smk all_sessions): per op, TP, search, step; then the point
    mem = memory_floor(s, recorded_gpu_memory(run))
    for op in s.ops:
        points = {}
        # the TP sizes the workflow's decision chain visits (rules/common.smk tp_chain): the first of tp_sizes,
        # then each decision's next; a TP measured under another config and off the chain now is left out
        tp, before = s.tp_sizes[0], None
        while True:
            if tp not in run.searched_tps(op):
                went = f"go on to TP={tp} after TP={before}" if before else f"start at TP={tp}"
                raise TptuneError(f"{op}: the new decisions {went}, which the run did not measure (it "
                                  f"measured {run.searched_tps(op)}); re-measure this run")
            results = []
            for dim in dimensions(s, op, tp):
                prev, step = None, 0
                while True:
                    recorded = run.search_step(op, tp, dim, step)
                    if not recorded.exists():
                        raise TptuneError(f"{op} TP={tp} {dim}: the new decisions need step {step}, which the "
                                          "run did not measure; re-measure this run")
                    old = load.read_json(recorded)
                    rec = step_record(s, op, tp, dim, step, prev, run.root)
                    if rec["sessions"] != old["sessions"][:len(rec["sessions"])]:
                        raise TptuneError(f"{op} TP={tp} {dim} step {step}: the new decisions measure "
                                          f"{rec['sessions'][-1]['values']}, the run measured other points")
                    if rec.get("best") != old.get("best"):
                        notes.append(f"{op} TP={tp} {dim}: best {old.get('best')} -> {rec.get('best')}")
                    write_record(recorded, rec)
                    if any(e["step"] == step for e in rec["sessions"]):
                        sessions.append(run.step_session(op, tp, dim, step) / SESSION_JSON)
                    if rec["done"]:
                        break
                    prev, step = rec, step + 1
                write_record(run.search_result(op, tp, dim), rec)
                results.append(rec)
            write_record(run.tp_results(op, tp), results)
            pt = tp_point(s, op, tp, results, load_session(run.point_session(op, tp)))
            write_record(run.tp_point(op, tp), pt)
            sessions.append(run.point_session(op, tp) / SESSION_JSON)
            _analysed(run, sessions[-1])          # the trace verdict reads the point's analysis
            # as the workflow's tp_step reads them (cli.cmd_tp_step)
            points[tp] = with_verdict(pt, load.point_analysis(run, op, tp))
            dec = tp_step(s, op, tp, dict(points), mem)
            write_record(run.tp_decision(op, tp), dec)
            final = run.tp_decision(op, tp)
            if dec["next"] is None:
                break
            tp, before = dec["next"], tp
        last = load.read_json(final)
        write_record(run.op_final(op), last)     # as the op_final rule copies it
        finals.append(run.op_final(op))
    for sj in sessions:
        _analysed(run, sj)
    collect(run, sessions, run.measurements_parquet)
    for lf in run.layer_jsons():   # the block measured the recorded tuned preset
        old = load.read_json(lf)
        block = load_session(run.layer_session(old["tp"]))
        rec = layer_record(s, old["tp"], block, _tuned(s, run, old, block))
        if rec["winner"] != old.get("winner"):
            notes.append(f"layer TP={old['tp']}: block winner {old.get('winner')} -> {rec['winner']}")
        write_record(lf, rec)
    rederive_confirm(run)       # the training-loop stage's comparisons, from its recorded launches
    answer(s, run, finals)
    if run.packing_plan_json.is_file():     # the packed sessions' decision (workload.packing), from its plan
        from tptune.cli.packing import decide as packing_decide, load_spec

        spec, lengths = load_spec(run.config_json)
        packing_decide(s, run, spec, lengths)
    render_report(s, run, run.report_md)
    return notes

# Validation of the run config (before any job) and every input function of the workflow.
import json
import os
from pathlib import Path
import sys
import shlex

from snakemake.exceptions import WorkflowError

from tptune.cases import WILDCARD_CONSTRAINTS
from tptune.errors import ConfigError, TptuneError
from tptune.measure.preflight import cpu_notes, resolve_here
from tptune.records import progress, run_lock
from tptune.records.run_dir import (SESSION_JSON, RunDir, layer_session_name, packed_session_name, point_session_name,
                                    step_session_name)
from tptune.search import measurement as wm
from tptune.search import packed as packed_stage
from tptune.search import steps as wf
from tptune.settings import backend_defaults
from tptune.settings.resolve import load_config_files

try:
    # Each --configfile read as tptune validate reads it (settings.resolve.load_config_files): a model file given
    # as one is named as such with the run config line it belongs in, not one "unknown key" per model field.
    for _f in getattr(workflow, "overwrite_configfiles", None) or ():
        load_config_files(os.path.relpath(_f))
    # A dry run only plans, and a submit host (TPTUNE_SUBMIT_ONLY=1, e.g. a Slurm login node) only
    # submits: neither needs a GPU (the measuring jobs check the hardware they run on).
    S = resolve_here(config, source="run config (config/config.yaml + --configfile/--config)",
                     check_hardware=not (getattr(workflow.output_settings, "dryrun", False)
                                         or os.environ.get("TPTUNE_SUBMIT_ONLY") == "1"))
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# Without a GPU: a model far larger than the CPU default, or --resources gpus=N beyond the CPU worker pool,
# is said once, before any job (measure.preflight.cpu_notes).
if workflow.is_main_process:
    try:
        _GPUS_RESOURCE = int(workflow.global_resources["gpus"].value)
    except (KeyError, AttributeError, TypeError, ValueError):
        _GPUS_RESOURCE = None
    for _note in cpu_notes(S, _GPUS_RESOURCE):
        print(_note, file=sys.stderr)

# Every path inside the run folder comes from R (records.run_dir.RunDir); the rules give it wildcards
# ("{op}", "{tp}", ...) where they name a pattern.
R = RunDir.of_run(S.run)
# A snakemake killed outright leaves Snakemake's lock behind, and Snakemake refuses the rerun below: say
# so, with the command that removes it (records.run_lock.stale_snakemake_lock; nothing is removed here).
_STALE_LOCK = run_lock.stale_snakemake_lock(R, sys.argv)
if _STALE_LOCK:
    print(f"tptune: {_STALE_LOCK}", file=sys.stderr)
CONFIG_JSON = str(R.config_json)
CALIBRATION = str(R.calibration_json)       # timing.window_ms: auto (rules/calibrate.smk)
MODEL_JSON = str(R.model_json)


def calibration_input(wc=None):
    """What a measuring job needs besides its own inputs: the node's window calibration, when the
    run asks for one (timing.window_ms: auto)."""
    return {"calibration": CALIBRATION} if S.window_auto else {}


# The resolved run config is written by the run_config job (rules/report.smk), never here: parsing
# happens before Snakemake takes its lock and in every dry run, and neither may change a run's files.
# The backend and the backend-dependent defaults are recorded resolved (settings.backend_defaults.recorded).
RESOLVED_CONFIG = json.dumps({**backend_defaults.recorded(config, S.backend, S.model.workload.is_fp8),
                              "_base_dir": os.getcwd(), "_source": "run config"}, indent=1, sort_keys=True)


wildcard_constraints:
    op=WILDCARD_CONSTRAINTS["op"],
    tp=WILDCARD_CONSTRAINTS["tp"],
    dim=r"[a-z]+(\.[a-z_]+)?",
    step=r"\d+",


# Params. A measuring job's params are its session's measurement settings (workflow.measurement):
# exactly what changes its measurement, so a changed setting re-measures exactly the sessions it
# touches; the job is handed their digest and refuses a config.json that gives others. The deriving
# jobs' params are the settings they derive with; decide and report take the whole config.
def _measure_params(m):
    return {"settings": json.dumps(m, sort_keys=True), "digest": wm.settings_digest(m)}


_PENDING = {"settings": "(after a checkpoint)", "digest": "pending"}   # the job is re-created after it


# Functions of the wildcards only: Snakemake neither records nor compares params that take input.
def step_measurement(wc):
    prev = None
    if int(wc.step) > 0:
        f = str(R.search_step(wc.op, wc.tp, wc.dim, int(wc.step) - 1))
        if not os.path.exists(f):
            return _PENDING
        prev = _read(f)
    return _measure_params(wm.step_measurement(S, wc.op, int(wc.tp), wc.dim, prev))


def point_measurement(wc):
    f = str(R.tp_results(wc.op, wc.tp))
    if not os.path.exists(f):
        return _PENDING
    return _measure_params(wm.point_measurement(S, wc.op, int(wc.tp), _read(f)))


def layer_measurement(wc):
    return _measure_params(wm.layer_measurement(S, int(wc.tp)))


def step_derive_params(wc):
    """What a search step's record derives with besides its sessions: the op's search, the margins."""
    return json.dumps({"backend": S.backend, "search": S.op(wc.op).search.as_dict(),
                       "margins": S.decision.step_margins}, sort_keys=True)


def point_derive_params(wc):
    return json.dumps({"backend": S.backend, "search": S.op(wc.op).search.as_dict(),
                       "noise_floor": S.decision.noise_floor}, sort_keys=True)


def tp_derive_params(wc):
    return json.dumps(S.recorded("decision", "gpus_per_node", "parallel", "hardware")
                      | {"tps": S.tp_sizes}, sort_keys=True)


def _read(path):
    with open(path) as fh:
        return json.load(fh)


def _ckpt_output(ckpt, **wildcards):
    """A checkpoint's output, or 'not yet' when an earlier run's file is gone because it reruns now."""
    from snakemake.exceptions import IncompleteCheckpointException
    from snakemake.io import checkpoint_target

    job = ckpt.get(**wildcards)
    if not os.path.exists(job.output[0]):
        raise IncompleteCheckpointException(job.rule, checkpoint_target(job.output[0]))
    return job.output[0]


def step_file(op, tp, dim, step):
    return _ckpt_output(checkpoints.search_step, op=op, tp=str(tp), dim=dim, step=str(step))


def search_final(op, tp, dim):
    """Walk one binary search's checkpoint steps to the one that says it is done."""
    step = 0
    while True:
        rec = _read(step_file(op, tp, dim, step))
        if rec["done"]:
            return step_file(op, tp, dim, step), rec
        step += 1


def _step_inputs(wc, prev=lambda f: f):
    """The model, the calibration and (after step 0) the previous step's record, as ``prev`` wraps it."""
    ins = {"model": MODEL_JSON, **calibration_input()}
    if int(wc.step) > 0:
        ins["prev"] = prev(step_file(wc.op, int(wc.tp), wc.dim, int(wc.step) - 1))
    return ins


def measure_step_inputs(wc):
    """The previous step's record only says what this step measures, which the params hold: a re-derived
    record that asks for the same points re-measures nothing (ancient)."""
    return _step_inputs(wc, ancient)


def search_step_inputs(wc):
    """The previous step's record and this step's session (none for a single-candidate dimension:
    there is nothing to measure)."""
    ins = _step_inputs(wc)
    prev = _read(ins["prev"]) if "prev" in ins else None
    if wf.step_cases(S, wc.op, int(wc.tp), wc.dim, prev):
        ins["session"] = str(R.step_session(wc.op, wc.tp, wc.dim, wc.step) / SESSION_JSON)
    return ins


def search_result_input(wc):
    return search_final(wc.op, int(wc.tp), wc.dim)[0]


def tp_results_inputs(wc):
    """Static: one result per dimension, so the searches of one (op, TP) run side by side."""
    tp = int(wc.tp)
    return [str(R.search_result(wc.op, tp, d)) for d in wf.dimensions(S, wc.op, tp)]


def tp_point_inputs(wc):
    """The searches' results only say what the point measures, which the params hold (ancient)."""
    return {"results": ancient(_ckpt_output(checkpoints.tp_results, op=wc.op, tp=wc.tp)),
            "model": MODEL_JSON, **calibration_input()}


def tp_decision_file(op, tp):
    return _ckpt_output(checkpoints.tp_step, op=op, tp=str(tp))


def tp_chain(op):
    """TP sizes the decision of ``op`` visited, and its final decision file."""
    tp, visited = S.tp_sizes[0], []
    while True:
        visited.append(tp)
        f = tp_decision_file(op, tp)
        rec = _read(f)
        if rec["next"] is None:
            return visited, f
        if not isinstance(rec["next"], int) or rec["next"] <= tp:
            # a chain that does not climb would be walked forever inside Snakemake's DAG update
            raise WorkflowError(f"{f}: 'next' is {rec['next']!r}, not a TP above {tp}: the TP decision of "
                                f"{op} cannot go on; re-derive it (snakemake -R {f})")
        tp = rec["next"]


def tp_step_inputs(wc):
    tps = [t for t in S.tp_sizes if t <= int(wc.tp)]
    return {"points": [str(R.tp_point(wc.op, t)) for t in tps],
            "analysis": [str(R.point_analysis(wc.op, t)) for t in tps]}


def op_final_input(wc):
    return tp_chain(wc.op)[1]


def all_sessions(wc):
    """(search-step or TP-point file, its session folder) of every session this run measured."""
    _ckpt_output(checkpoints.searches_done)
    out = []
    for op in S.ops:
        for tp in tp_chain(op)[0]:
            for d in wf.dimensions(S, op, tp):
                step = 0
                while True:
                    f = step_file(op, tp, d, step)
                    rec = _read(f)
                    if any(e["step"] == step for e in rec["sessions"]):
                        out.append((f, str(R.step_session(op, tp, d, step))))
                    if rec["done"]:
                        break
                    step += 1
            out.append((str(R.tp_point(op, tp)), str(R.point_session(op, tp))))
    return out


def all_session_records(wc):
    return [f for f, _ in all_sessions(wc)]


def all_session_jsons(wc):
    return [f"{d}/{SESSION_JSON}" for _, d in all_sessions(wc)]


def all_session_analysis(wc):
    return [str(R.session_analysis(d)) for _, d in all_sessions(wc)]


def layer_tps():
    """TP sizes measured for every op: the layer stage runs at each (nothing when it is disabled)."""
    if not S.layer.enabled:
        return []
    _ckpt_output(checkpoints.searches_done)
    return sorted(set.intersection(*(set(tp_chain(op)[0]) for op in S.ops)))


def layer_files(wc):
    return [str(R.layer_json(tp)) for tp in layer_tps()]


def layer_inputs(wc):
    return [str(R.tp_point(op, wc.tp)) for op in S.ops]


def scheduled_sessions():
    """The sessions this invocation measures for certain as its DAG stands at the start, for the progress
    line: its measuring jobs with no checkpoint job to run above them (a job below one may drop out once
    the checkpoint has run, and the jobs a checkpoint adds are read from the records, search.ahead).
    None where Snakemake's DAG cannot be read."""
    names = {"measure_step": lambda w: step_session_name(w.op, w.tp, w.dim, w.step),
             "measure_point": lambda w: point_session_name(w.op, w.tp),
             "layer": lambda w: layer_session_name(w.tp),
             "measure_packed": lambda w: packed_session_name(w.tp, w.capacity)}
    try:
        dag = workflow.dag
        todo = set(dag.needrun_jobs())

        def below_a_checkpoint(job):
            seen, stack = set(), list(dag.dependencies[job])
            while stack:
                dep = stack.pop()
                if dep not in seen:
                    seen.add(dep)
                    if dep.is_checkpoint and dep in todo:
                        return True
                    stack.extend(dag.dependencies[dep])
            return False

        return [names[job.rule.name](job.wildcards) for job in todo
                if job.rule.name in names and not below_a_checkpoint(job)]
    except Exception:   # Snakemake's DAG is not an API: without it the line counts from the records alone
        return None


def confirm_files(wc=None):
    """The report's confirm.json input where the confirm stage is on (confirm.enabled, te backend; rules/report.smk)."""
    return [str(R.confirm_json)] if S.confirm.enabled and S.backend == "te" else []


# Packed micro-batches (workload.packing, rules/packing.smk; search.packed).
_PACKING = packed_stage.packing_spec(S)
_PACKED_NATIVE = {}     # tp -> the native points: one packing of every step, shared by the capacities' params


def _packing_lengths():
    if "lengths" not in _PACKED_NATIVE:
        _PACKED_NATIVE["lengths"] = _PACKING.load(os.getcwd())
    return _PACKED_NATIVE["lengths"]


def packed_measurement(wc):
    """The packed session's measurement settings (search.packed.packed_measurement): bins and native points from
    the run config, so a change to workload.packing re-measures exactly these sessions."""
    tp, lengths = int(wc.tp), _packing_lengths()
    if tp not in _PACKED_NATIVE:
        _PACKED_NATIVE[tp] = packed_stage.native_points(S, _PACKING, lengths, tp)
    return _measure_params(packed_stage.packed_measurement(S, tp, int(wc.capacity), _PACKING, lengths,
                                                           _PACKED_NATIVE[tp]))


def packed_sessions(wc):
    """The packed sessions the plan (packing/plan.json, a checkpoint) names."""
    plan = _read(_ckpt_output(checkpoints.packing_plan))
    return [str(R.packed_session(plan["tp"], c) / SESSION_JSON) for c in plan["capacities"]] if plan["tp"] else []


def packing_files(wc=None):
    """The report's packing.json input where the run has workload.packing (rules/report.smk)."""
    return [str(R.packing_json)] if _PACKING is not None else []

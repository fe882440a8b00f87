# Validation of the run config (before any job) and every input function of the workflow.
import json
import os
from pathlib import Path
import sys

from snakemake.exceptions import WorkflowError

from tptune.cases import WILDCARD_CONSTRAINTS, make_case, parse_case_id
from tptune.errors import ConfigError
from tptune.settings import resolve
from tptune import workflow as wf

try:
    S = resolve(config, source="run config (config/config.yaml + --configfile/--config)")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

RUN_DIR = f"outputs/{S.run}"
CONFIG_JSON = f"{RUN_DIR}/config.json"


def _write_if_changed(path, text):
    """The resolved config that every job reads; rewritten only when it changes (rules take it as
    ancient(), so only the per-op params below decide what reruns)."""
    try:
        if open(path).read() == text:
            return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


_write_if_changed(CONFIG_JSON, json.dumps({**config, "_base_dir": os.getcwd(), "_source": "run config"},
                                          indent=1, sort_keys=True))


wildcard_constraints:
    op=WILDCARD_CONSTRAINTS["op"],
    tp=WILDCARD_CONSTRAINTS["tp"],
    variant=WILDCARD_CONSTRAINTS["variant"],
    dim=r"[a-z]+(\.[a-z_]+)?",
    step=r"\d+",


def case_run(case):
    return f"{RUN_DIR}/{case.dir}/run.json"


def case_analysis(case):
    return f"{RUN_DIR}/analysis/{case.op}/tp{case.tp}/{case.variant_id}.parquet"


def op_params(wc):
    """What a case's measurement depends on: changing it reruns that op's cases only."""
    case = make_case(wc.op, wc.tp, wc.variant)
    return json.dumps({"backend": S.backend, "device": S.device, "op": S.op_settings(wc.op),
                       "fault": S.config.get("faults", {}).get(case.id)}, sort_keys=True)


def search_params(wc):
    return json.dumps({"backend": S.backend, "op": S.op_settings(wc.op), "decision": S.config["decision"]},
                      sort_keys=True)


def _read(path):
    with open(path) as fh:
        return json.load(fh)


def step_file(op, tp, dim, step):
    return checkpoints.search_step.get(op=op, tp=str(tp), dim=dim, step=str(step)).output[0]


def search_final(op, tp, dim):
    """Walk one binary search's checkpoint steps to the one that says it is done."""
    step = 0
    while True:
        rec = _read(step_file(op, tp, dim, step))
        if rec["done"]:
            return step_file(op, tp, dim, step), rec
        step += 1


def search_step_inputs(wc):
    step, tp = int(wc.step), int(wc.tp)
    prev = _read(step_file(wc.op, tp, wc.dim, step - 1)) if step > 0 else None
    ins = {"cases": [case_run(c) for c in wf.step_cases(S, wc.op, tp, wc.dim, prev)]}
    if step > 0:
        ins["prev"] = step_file(wc.op, tp, wc.dim, step - 1)
    return ins


def search_result_input(wc):
    return search_final(wc.op, int(wc.tp), wc.dim)[0]


def tp_results_inputs(wc):
    """Static: one result per dimension, so the searches of one (op, TP) run side by side, and the
    reference cases, so they are measured alongside the searches."""
    tp = int(wc.tp)
    return {"results": [f"{RUN_DIR}/search/{wc.op}/tp{tp}/{d}/result.json" for d in wf.dimensions(S, wc.op, tp)],
            "references": [case_run(c) for c in wf.reference_cases(S, wc.op, tp)]}


def tp_cases(op, tp):
    """Cases the TP point of (op, tp) compares: references, each search's winner, and the tuned combination."""
    results = _read(checkpoints.tp_results.get(op=op, tp=str(tp)).output[0])
    winners, tuned = wf.point_cases(S, op, tp, results, Path(RUN_DIR))
    cases = wf.reference_cases(S, op, tp) + [tuned] + [parse_case_id(c) for c in winners]
    return list({c.id: c for c in cases}.values())


def tp_point_inputs(wc):
    cases = tp_cases(wc.op, int(wc.tp))
    return {"runs": [case_run(c) for c in cases], "analysis": [case_analysis(c) for c in cases],
            "results": checkpoints.tp_results.get(op=wc.op, tp=wc.tp).output[0]}


def tp_decision_file(op, tp):
    return checkpoints.tp_step.get(op=op, tp=str(tp)).output[0]


def tp_chain(op):
    """TP sizes the decision of ``op`` visited, and its final decision file."""
    tp, visited = S.tp_sizes[0], []
    while True:
        visited.append(tp)
        f = tp_decision_file(op, tp)
        rec = _read(f)
        if rec["next"] is None:
            return visited, f
        tp = rec["next"]


def tp_step_inputs(wc):
    tps = [t for t in S.tp_sizes if t <= int(wc.tp)]
    return [f"{RUN_DIR}/search/{wc.op}/tp{t}/point.json" for t in tps]


def op_final_input(wc):
    return tp_chain(wc.op)[1]


def all_cases(wc):
    """Every case any search of this run measured (for the measurements table and the report)."""
    checkpoints.searches_done.get()
    cases = {}
    for op in S.ops:
        for tp in tp_chain(op)[0]:
            cases.update((c.id, c) for c in tp_cases(op, tp))
            for d, dim in wf.dimensions(S, op, tp).items():
                rec = search_final(op, tp, d)[1]
                cases.update((c.id, c) for c in map(dim.case_of, rec["asked"]))
    return [cases[k] for k in sorted(cases)]


def all_case_runs(wc):
    return [case_run(c) for c in all_cases(wc)]


def all_case_analysis(wc):
    return [case_analysis(c) for c in all_cases(wc)]

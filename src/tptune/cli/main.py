"""tptune: which tensor-parallel size, and which TP comm overlap config, make a model fastest on this node.
The run itself is the Snakemake workflow (snakemake --cores N [--configfile my-run.yaml]; README.md);
these commands check its inputs, read its outputs and check config files, and are the steps its rules run.
Each subcommand imports the stage it runs inside its function: all of them (polars, the decision code, the
launcher, the report) would add about a second to every step the workflow starts."""
from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

from tptune import __version__
from tptune.cases import parse_case_id
from tptune.cli.check import add_check_parser
from tptune.cli.figures import add_figures_parser
from tptune.cli.wall import add_predict_parser, write_plan_estimate
from tptune.emit.records import write_record
from tptune.emit.tables import write_table
from tptune.errors import TptuneError
from tptune.measure import console
from tptune.measure.preflight import resolve_here
from tptune.records import load
from tptune.records.run_dir import SESSION_JSON, RunDir
from tptune.records.run_status import check_run_dir, failed_outputs, run_failures
from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import load_session, load_sessions, recorded_gpu_memory
from tptune.settings.resolve import is_run_record, load_run_config
from tptune.trace.cli import analyze_cli


class Once(argparse.Action):
    """A single-valued option that may be given once: a repeat (``verify --tp 2 --tp 4``) is refused, naming
    both values, where argparse would keep the last one silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in seen:
            raise argparse.ArgumentError(self, f"given twice ({getattr(namespace, self.dest)!r}, then {values!r}): "
                                               "give it once")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


def _settings(path, check_hardware: bool = False, calibrated: bool = True, node_tps: list[int] | None = None,
              recorded: bool = True):
    """The run's settings from its config.json (or, with ``recorded=False``, from run config YAML(s)
    layered over config/config.yaml: ``path`` may be a list). Only profiling needs the hardware the run
    names, and only the TP sizes ``node_tps`` it profiles (default: all). ``calibrated``: a
    ``timing.window_ms: auto`` takes the window of the run's calibration (calibration/window.json beside
    config.json), which measuring cannot do without."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if recorded and not (len(paths) == 1 and is_run_record(paths[0])):
        raise TptuneError(f"{', '.join(map(str, paths))}: expected a run's outputs/<run>/config.json (the workflow "
                          "writes it; this step reads the run folder beside it)" + _what_is(paths[0]))
    cfg, source, base_dir = load_run_config(paths)
    model = cfg.get("model")
    if isinstance(model, str) and not (Path(base_dir) / model).exists() and (Path.cwd() / model).exists():
        base_dir = "."  # outputs copied from another machine: resolve the model from here
    s = resolve_here(cfg, source=source, base_dir=base_dir, check_hardware=check_hardware, node_tps=node_tps)
    if not (calibrated and s.window_auto):
        return s
    run = RunDir(Path(paths[0]).parent)
    window = (load.calibration(run) or {}).get("window_ms")
    if window is None:
        if check_hardware:
            raise TptuneError(f"timing.window_ms is auto, but {run.calibration_json} holds no "
                              "calibrated window: the workflow's "
                              "calibrate_window rule writes it (or give timing.window_ms in ms)")
        return s
    return s.with_window(window)


def _what_is(path) -> str:
    """What a file given in place of a run's config.json is, for the error that refuses it."""
    path = Path(path)
    if not path.exists():
        return ": no such file"
    if path.is_dir():
        config_json = RunDir(path).config_json
        return f": a folder (a run folder holds config.json: {config_json})" \
            if config_json.is_file() else ": a folder"
    if path.suffix in (".yaml", ".yml"):
        return ": a YAML file is a run config, which `tptune validate`, `model` and `plan` take (layered over " \
               "config/config.yaml); snakemake --configfile it to make the run"
    return ""


def _run_folder(path: str) -> RunDir:
    """A run folder outputs/<run> (holds config.json), or a clear error naming what ``path`` is instead."""
    run = RunDir(path)
    if not run.root.exists():
        raise TptuneError(f"{run}: no such folder (expected a run folder, outputs/<run>, holding config.json)")
    if not run.root.is_dir():
        raise TptuneError(f"{run}: not a folder (expected a run folder, outputs/<run>, holding config.json)")
    if not run.config_json.is_file():
        raise TptuneError(f"{run}: not a run folder: no config.json in it (the workflow writes "
                          "outputs/<run>/config.json when a run starts)")
    return run


def _run_dir(a) -> RunDir:
    """Every file of a run lies in the folder of its config.json (or of the output named)."""
    return RunDir(Path(a.config).parent if getattr(a, "config", None) else Path(a.out).parent)


def _read_json(path: str | Path, what: str, keys: tuple[str, ...] = ()):
    """A JSON file the user (or the workflow) gave, or one line saying it is not ``what``."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise TptuneError(f"{path}: no such file (expected {what})") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TptuneError(f"{path}: not {what}: {exc}") from None
    missing = [k for k in keys if not (isinstance(obj, dict) and k in obj)]
    if missing:
        raise TptuneError(f"{path}: not {what}: no {', '.join(repr(k) for k in missing)} in it")
    return obj


def _submit_only() -> bool:
    return os.environ.get("TPTUNE_SUBMIT_ONLY") == "1"


def cmd_validate(a) -> int:
    """As the workflow checks at parse time: the run config(s) over config/config.yaml (or a run's
    config.json), the model, the cross-field rules, and this node (skipped on a submit host)."""
    s = _settings(a.configfile, check_hardware=not _submit_only(), recorded=False)
    m, w = s.model.model, s.model.workload
    print(f"ok: {m.name} hidden={m.hidden_size} ffn={m.ffn_hidden_size} heads={m.num_attention_heads} "
          f"groups={m.num_query_groups} kv={m.kv_channels} gated={m.gated_mlp} | seq={w.seq_length} "
          f"mbs={w.micro_batch_size} {w.dtype} | backend={s.backend} device={s.device} tp={s.tp_sizes} run={s.run}"
          + (" | hardware not checked (TPTUNE_SUBMIT_ONLY=1: its jobs check where they run)" if _submit_only() else ""))
    if s.ops_note:
        print(s.ops_note)
    for t in s.traps():     # what would switch TP overlap off in training (errors were refused above)
        print(t.line)
    from tptune.measure.preflight import cpu_notes
    for line in cpu_notes(s):   # a CPU run of a model far larger than the CPU default
        print(line)
    return 0


def cmd_model(a) -> int:
    s = _settings(a.config, recorded=False)
    write_record(a.out, s.model.to_dict())
    return 0


def cmd_plan(a) -> int:
    from tptune.model.plan import Hardware, build_plan

    s = _settings(a.config, recorded=False)
    plan = build_plan(s.model, s.tp_sizes, Hardware.from_dict(s.hardware.as_dict()), s.ops)
    write_table(plan, a.out, csv=True)
    write_plan_estimate(s, RunDir(Path(a.out).parent))     # wall_predicted.json; never fails the plan
    return 0


def cmd_profile(a) -> int:
    """One case alone (no side-by-side partner): for smoke tests and ad-hoc checks."""
    from tptune.measure.launch import Launcher

    case = parse_case_id(a.case)
    s = _settings(a.config, check_hardware=True, node_tps=[case.tp], recorded=False)
    op_settings = {**s.op(case.op).as_dict(), "fault": s.faults.get(case.id)}
    run = MeasuredPoint.from_dict(Launcher(s).profile(case, s.model, Path(a.out).parent, op_settings), a.out)
    print(f"{case.id}: {run.status}"
          + (f" ({run.error_kind}: {(run.error_message or '')[:300]})" if run.error else ""))
    return 0


def _measured_settings(a, m_of):
    """The measurement settings (search.measurement) of this job from the run's config.json, after
    checking they are those the workflow scheduled it with (--expect, the digest of the rule's params):
    a config.json changed under a scheduled job (another invocation, a hand edit) is refused, never
    measured with. ``m_of(settings)`` builds them; the window of timing.window_ms: auto is resolved after
    the check (the params hold "auto")."""
    from tptune.search.measurement import settings_digest

    if getattr(a, "expect", None):
        got = settings_digest(m_of(_settings(a.config, calibrated=False)))
        if got != a.expect:
            raise TptuneError(f"{a.config} gives this session other measurement settings (digest {got}) than the "
                              f"workflow scheduled it with ({a.expect}): the run's config.json changed under it; "
                              "nothing measured (rerun snakemake with the run's config)")
    s = _settings(a.config, check_hardware=True, node_tps=[a.tp])   # a job is granted only its TP's GPUs
    return s, m_of(s)


def _measure_session(s, m: dict, cases, run: RunDir, sdir: Path, presets_dir: Path | None = None) -> dict:
    """Measure ``cases`` side by side in one session (launch.Launcher.session), exactly as the measurement
    settings ``m`` say (search.measurement), which session.json records. The drift canary opens the
    sessions that carry evidence (TP points, the layer stage): one per op and TP is enough to see the
    machine drift over a run, and a bisection step's two points are compared within their session. Ends with
    the run's progress line on the console (cli.progress)."""
    from tptune.cli.progress import session_finished
    from tptune.measure.launch import Launcher
    from tptune.measure.session_spec import SessionSpec
    from tptune.search.measurement import launcher_op_settings

    op_settings = launcher_op_settings(m)
    ids = {c.id for c in cases} | ({m["canary"]} if m["canary"] else set())
    faults = {cid: f for cid, f in s.faults.items() if cid in ids}
    if presets_dir is not None:
        op_settings["te"] = {"presets_dirs": [str(presets_dir.resolve())]}
    spec = SessionSpec(
        run.session_name(sdir), cases, s.model, op_settings,
        contenders=m["contenders"], canary=parse_case_id(m["canary"]) if m["canary"] else None,
        margin=m["margin"], tie_margin=m["tie_margin"], faults=faults, evidence=m["evidence"],
        profile=m.get("profile", True),
        always=m["always"], record={**m, **({"injected_faults": faults} if faults else {})})
    rec = Launcher(s).session(spec, sdir)
    bad = rec["failed"]
    print(f"{sdir}: {len(cases)} settings x {rec['rounds']} rounds, {rec['stop']}"
          + (f"; failed: {', '.join(bad)}" if bad else ""))
    session_finished(s, run, spec.session_id, rec)
    return rec


def cmd_analyze_case(a) -> int:
    from tptune.cli.stages import analyze_case

    _read_json(a.run_json, "a case's run.json (tptune profile or a session writes it)", ("case", "status"))
    analyze_case(Path(a.run_json), Path(a.out))
    return 0


def cmd_analyze_session(a) -> int:
    from tptune.cli.stages import analyze_session

    _read_json(Path(a.session) / SESSION_JSON, "a session's session.json (--session is the folder holding it)",
               ("runs",))
    analyze_session(Path(a.session), Path(a.out))
    return 0


def cmd_search_step(a) -> int:
    from tptune.search.steps import step_record

    s = _settings(a.config)
    prev = _read_json(a.prev, "the previous search step's record (--prev)") if a.prev else None
    write_record(a.out, step_record(s, a.op, a.tp, a.dim, a.step, prev, _run_dir(a).root))
    return 0


def cmd_measure_step(a) -> int:
    from tptune.search.steps import step_cases
    from tptune.search.measurement import step_measurement
    prev = _read_json(a.prev, "the previous search step's record (--prev)") if a.prev else None
    s, m = _measured_settings(a, lambda s: step_measurement(s, a.op, a.tp, a.dim, prev))
    cases = step_cases(s, a.op, a.tp, a.dim, prev)
    if not cases:
        raise TptuneError(f"{a.op} TP={a.tp} {a.dim} step {a.step}: nothing to measure")
    run = _run_dir(a)
    _measure_session(s, m, cases, run, run.step_session(a.op, a.tp, a.dim, a.step))
    return 0


def cmd_measure_point(a) -> int:
    from tptune.search.steps import point_members
    from tptune.search.measurement import point_measurement

    run = _run_dir(a)
    results = load.tp_results(run, a.op, a.tp)
    s, m = _measured_settings(a, lambda s: point_measurement(s, a.op, a.tp, results))
    members, _ = point_members(s, a.op, a.tp, results)
    _measure_session(s, m, members, run, run.point_session(a.op, a.tp))
    return 0


def cmd_tp_point(a) -> int:
    from tptune.decide.tp_point import tp_point

    s = _settings(a.config)
    run = _run_dir(a)
    write_record(a.out, tp_point(s, a.op, a.tp, load.tp_results(run, a.op, a.tp),
                                load_session(run.point_session(a.op, a.tp))))
    return 0


def cmd_layer(a) -> int:
    """The layer stage of one TP: measure the block session (unless --no-measure), write its record."""
    from tptune.cli.stages import block_members
    from tptune.decide.layer import layer_record
    from tptune.search.measurement import layer_measurement
    from tptune.search.steps import point_contenders

    run = _run_dir(a)
    if a.measure:
        s, m = _measured_settings(a, lambda s: layer_measurement(s, a.tp))
    else:
        s, m = _settings(a.config), None
    points = {op: load.tp_point(run, op, a.tp) for op in s.ops}
    members, tuned = block_members(s, a.tp, points, run)
    if a.measure:
        # the bound (nocomm) is measured every round beside the others but never leads: a session whose
        # leader was the bound would resolve every setting against it after min_rounds and stop there
        m = {**m, "members": [c.id for c in members], "always": [tuned.id], "contenders": point_contenders(members)}
        _measure_session(s, m, members, run, run.layer_session(a.tp), presets_dir=run.presets)
    write_record(Path(a.out), layer_record(s, a.tp, load_session(run.layer_session(a.tp)), tuned.id))
    return 0


def cmd_packing_plan(a) -> int:
    """What the packed sessions measure (issue 53): their TP and capacities, after the run's decisions."""
    from tptune.cli.packing import load_spec, write_plan

    s = _settings(a.config)
    spec, lengths = load_spec(a.config)
    write_plan(s, _run_dir(a), spec, lengths, Path(a.out))
    return 0


def cmd_measure_packed(a) -> int:
    """One packed block session (search.packed): the capacity's settings and the native points side by side."""
    from tptune.cli.packing import load_spec
    from tptune.search.packed import native_points, packed_measurement, session_members, settings_of

    run = _run_dir(a)
    spec, lengths = load_spec(a.config)
    native = {}

    def m_of(s):
        if "n" not in native:
            native["n"] = native_points(s, spec, lengths, a.tp)
        return packed_measurement(s, a.tp, a.capacity, spec, lengths, native["n"])

    s, m = _measured_settings(a, m_of)
    settings = settings_of(load.read_json(run.layer_json(a.tp)), s)
    members, contenders, always = session_members(a.tp, m, settings)
    m = {**m, "members": [c.id for c in members], "contenders": contenders, "always": always}
    _measure_session(s, m, members, run, run.packed_session(a.tp, a.capacity), presets_dir=run.presets)
    return 0


def cmd_packing_decide(a) -> int:
    """packing.json and each framework's settings at the chosen T, from the packed sessions."""
    from tptune.cli.packing import decide, load_spec

    s = _settings(a.config)
    spec, lengths = load_spec(a.config)
    rec = decide(s, _run_dir(a), spec, lengths)
    print(rec["sentence"])
    return 0


def cmd_tp_step(a) -> int:
    from tptune.decide.tp import memory_floor, tp_step
    from tptune.decide.tp_point import with_verdict

    s = _settings(a.config)
    run = _run_dir(a)
    points = {pt["tp"]: with_verdict(pt, load.point_analysis(run, pt["op"], pt["tp"]))
              for pt in (load.typed_tp_point(_read_json(p, "a TP point's point.json (--points)", ("tp",)), p)
                         for p in a.points)}
    write_record(a.out, tp_step(s, a.op, a.tp, points, memory_floor(s, recorded_gpu_memory(run))))
    return 0


def cmd_decide(a) -> int:
    from tptune.cli.stages import answer

    s = _settings(a.config)
    answer(s, _run_dir(a), [Path(p) for p in a.decisions])
    return 0


def cmd_collect(a) -> int:
    from tptune.cli.stages import collect

    collect(_run_dir(a), [Path(p) for p in a.sessions], Path(a.out))
    return 0


def cmd_report(a) -> int:
    from tptune.report.render import render_report

    s = _settings(a.config)
    render_report(s, _run_dir(a), Path(a.out))
    return 0


def cmd_join_json(a) -> int:
    write_record(a.out, [_read_json(p, "a JSON file") for p in a.inputs])
    return 0


def cmd_rederive(a) -> int:
    from tptune.cli.rederive import check_recorded, rederive

    run = _run_folder(a.run_dir)
    check_recorded(run)
    s = _settings(str(run.config_json))
    for note in rederive(s, run):
        print(note)
    print(f"re-derived {a.run_dir}")
    return 0


def cmd_verify(a) -> int:
    from tptune.cli.verify import format_table, run_verify

    wl = {"seq_length": a.seq_length, "micro_batch_size": a.micro_batch_size, "dtype": a.dtype}
    res = run_verify(a.model, a.tp, a.cfg or [], workload=wl, config_files=a.config or [], layers=a.layers,
                     ops=a.ops, out_dir=a.work_dir, pairs=[tuple(x) for x in a.pair or []])
    print(format_table(res))
    if a.json:
        write_record(a.json, res)
    bad = [r for sess in [res["block"], *(res.get("ops") or {}).values()] for r in sess["rows"]
           if r["status"] != "ok" or r["numerics"] is False]
    return 1 if bad else 0


def cmd_calibrate_window(a) -> int:
    """Choose timing.window_ms for this machine (window_calibration) and write the overlay to use it; with
    --run-config, the workflow's calibrate_window rule (timing.window_ms: auto)."""
    from tptune.measure.launch import Launcher
    from tptune.cli.calibrate import analyse, calibrate, format_table, load_sharded, not_measured
    from tptune.emit.calibration import write_calibration

    if a.source:
        try:
            rec = analyse(json.loads(Path(a.source).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TptuneError(f"--from {a.source}: not a calibration record (window.json): {exc}") from None
        print(format_table(rec))
        if a.out:
            print(f"wrote {', '.join(str(p) for p in write_calibration(rec, Path(a.out)) if p)}")
        return 0
    if a.run_config and a.config:
        raise TptuneError("give the run's config file(s) or --run-config (a run's config.json), not both")
    if a.run_config:
        s = _settings(a.run_config, check_hardware=True, calibrated=False, node_tps=[1])
        out = Path(a.out) if a.out else RunDir(Path(a.run_config).parent).calibration_dir
    else:
        s = load_sharded(a.config)[0]
        out = Path(a.out) if a.out else RunDir.of_run(s.run).calibration_dir
    try:
        windows = sorted({float(x) for x in a.windows.split(",")})
    except ValueError:
        windows = []
    if not windows or windows[0] <= 0:
        raise TptuneError(f"--windows {a.windows!r}: expected positive milliseconds, e.g. 500,750,1000,1500")
    if a.rounds < 3:
        raise TptuneError(f"--rounds {a.rounds}: at least 3 (an sd from 2 rounds has one degree of freedom per op)")
    bad = [op for op in (a.ops or []) if op not in s.ops]
    if bad:
        raise TptuneError(f"--ops: {', '.join(bad)} not among the run's ops ({', '.join(s.ops)})")
    if s.device != "cuda":
        if not a.run_config:
            print("tptune: calibrate-window chooses the GPU's timed window (timing.window_ms); on CPU a round "
                  "times timing.iters by wall clock and has no window", file=sys.stderr)
            return 2
        rec = not_measured(s, windows)     # the workflow goes on: the window is not used on CPU
    else:
        rec = calibrate(s, Launcher(s), candidates=windows, rounds=a.rounds, ops=a.ops or None)
    print(format_table(rec))
    js, overlay = write_calibration(rec, out)
    print(f"wrote {js}" + (f" and {overlay}: add it last, e.g. snakemake --configfile <your config> {overlay}"
                           if overlay and not a.run_config else ""))
    return 0 if rec["window_ms"] is not None else 1


def cmd_failed(a) -> int:
    """The measuring outputs of the sessions with a failed setting, for snakemake -R (run_status): a
    setting is re-measured with the settings it is compared to, never alone."""
    for f in failed_outputs(Path(a.run_dir)):
        print(f)
    return 0


def cmd_check_run(a) -> int:
    """The workflow's last job: the run ends non-zero when a stage had no successful member (the report,
    written before, says which at its top)."""
    run_dir = check_run_dir(a.run_dir)
    stages = run_failures(load_sessions(run_dir))["stages"]
    for st in stages:
        print(f"tptune: {st['stage']} failed: {st['headline']} ({st['reason']})",
              file=sys.stderr)
    if stages:
        print(f"tptune: {run_dir.report_md} says so at its top; fix the cause, then re-measure with "
              f"snakemake -R $(tptune failed {run_dir})", file=sys.stderr)
        return 1
    write_record(a.out, {"ok": True})
    return 0


def cmd_confirm(a) -> int:
    from tptune.confirm.entry import run

    return run(a)


def _step(sub, name: str, doc: str) -> argparse.ArgumentParser:
    """A step the workflow's rules run on a run folder: callable as any subcommand, but given without
    ``help`` so that ``tptune --help`` lists it apart from the user commands (build_parser's epilog)."""
    _STEPS.append(name)
    return sub.add_parser(name, description=doc)


_STEPS: list[str] = []


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tptune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"tptune {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, title="commands", metavar="<command>")
    _STEPS.clear()

    user_config = ("a run config YAML, layered over config/config.yaml as snakemake --configfile is (repeat "
                   "to layer several), or a run's outputs/<run>/config.json")
    p = sub.add_parser("validate", help="check a run config and its model before anything runs, as the "
                                        "workflow does (TPTUNE_SUBMIT_ONLY=1: without this node's hardware)")
    p.add_argument("configfile", nargs="+", help="run config YAML(s), layered over config/config.yaml in order, "
                                                 "or a run's outputs/<run>/config.json")
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("model", help="write the resolved model and workload (JSON)")
    p.add_argument("--config", required=True, action="append", help=user_config)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.set_defaults(fn=cmd_model)

    p = sub.add_parser("plan", help="analytic plan: shapes, FLOPs, bytes, estimates")
    p.add_argument("--config", required=True, action="append", help=user_config)
    p.add_argument("--out", required=True, help="the plan's .parquet (a .csv is written beside it)")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("profile", help="measure one case (writes run.json even on failure)")
    p.add_argument("--config", required=True, action="append", help=user_config)
    p.add_argument("--case", required=True)
    p.add_argument("--out", required=True, help="path of the case's run.json")
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser("analyze-case", help="trace metrics of one case")
    p.add_argument("--run-json", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_analyze_case)

    p = _step(sub, "search-step", "one step of one binary search: from its recorded session, "
                                           "decide what comes next")
    for k in ("config", "op", "dim", "out"):
        p.add_argument(f"--{k}", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--prev")
    p.set_defaults(fn=cmd_search_step)

    for name, fn, doc in (("measure-step", cmd_measure_step, "measure one search step's points side by side"),
                          ("measure-point", cmd_measure_point, "measure one TP point's settings side by side")):
        p = _step(sub, name, doc)
        for k in ("config", "op"):
            p.add_argument(f"--{k}", required=True)
        p.add_argument("--tp", type=int, required=True)
        p.add_argument("--expect", help="digest of the measurement settings the workflow scheduled (refused "
                                        "when the run's config.json gives others)")
        if name == "measure-step":
            p.add_argument("--dim", required=True)
            p.add_argument("--step", type=int, required=True)
            p.add_argument("--prev")
        p.set_defaults(fn=fn)

    p = _step(sub, "tp-point", "best setting of one op at one TP, from its recorded session: the "
                                        "references, the searches' winners and the tuned combinations")
    for k in ("config", "op", "out"):
        p.add_argument(f"--{k}", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.set_defaults(fn=cmd_tp_point)

    p = _step(sub, "layer", "the layer stage of one TP: the tuned combination, TE defaults, presets "
                                     "and no overlap on a whole transformer block, side by side")
    for k in ("config", "out"):
        p.add_argument(f"--{k}", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--no-measure", dest="measure", action="store_false")
    p.add_argument("--expect", help="digest of the measurement settings the workflow scheduled")
    p.set_defaults(fn=cmd_layer)

    p = _step(sub, "packing-plan", "the packed sessions' TP and capacities (workload.packing), after decide")
    for k in ("config", "out"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(fn=cmd_packing_plan)

    p = _step(sub, "measure-packed", "one packed block session: at capacity T, no overlap, the set and the "
                                     "best preset, beside native micro-batches, side by side")
    p.add_argument("--config", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--capacity", type=int, required=True)
    p.add_argument("--expect", help="digest of the measurement settings the workflow scheduled")
    p.set_defaults(fn=cmd_measure_packed)

    p = _step(sub, "packing-decide", "packing.json and each framework's settings at the chosen capacity")
    p.add_argument("--config", required=True)
    p.set_defaults(fn=cmd_packing_decide)

    p = _step(sub, "analyze-session", "trace metrics of every setting of one session")
    p.add_argument("--session", required=True, help="the session folder (holds session.json)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_analyze_session)

    p = _step(sub, "tp-step", "one step of the TP decision of one op")
    for k in ("config", "op", "out"):
        p.add_argument(f"--{k}", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--points", nargs="+", required=True)
    p.set_defaults(fn=cmd_tp_step)

    p = _step(sub, "collect", "all sessions' measurements and trace metrics in one table")
    p.add_argument("--out", required=True, help="measurements.parquet in the run folder")
    p.add_argument("--sessions", nargs="+", required=True, help="session.json files")
    p.set_defaults(fn=cmd_collect)

    p = _step(sub, "decide", "decisions.json and the config files users load")
    p.add_argument("--config", required=True)
    p.add_argument("--decisions", nargs="+", required=True)
    p.set_defaults(fn=cmd_decide)

    p = _step(sub, "report", "render report.md")
    for k in ("config", "out"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(fn=cmd_report)

    p = _step(sub, "join-json", "a JSON list of several JSON files (search bookkeeping)")
    p.add_argument("--out", required=True)
    p.add_argument("inputs", nargs="+")
    p.set_defaults(fn=cmd_join_json)

    p = sub.add_parser("rederive", help="re-derive a run's decisions, configs and report from its recorded "
                                        "sessions (no GPU)")
    p.add_argument("run_dir", help="the run folder, outputs/<run> (holds config.json and sessions/)")
    p.set_defaults(fn=cmd_rederive)

    p = sub.add_parser("verify", help="time and check --tp-comm-overlap-cfg files on this node's GPUs, on a "
                                      "whole transformer block, against no overlap, TE defaults and presets")
    p.add_argument("--model", required=True, action=Once, help="Megatron-style YAML or Hugging Face config.json")
    p.add_argument("--tp", type=int, required=True, action=Once,
                   help="the TP size, given once: a --cfg file is written for one TP, so run verify once per TP")
    p.add_argument("--cfg", action="append", help="a --tp-comm-overlap-cfg YAML (repeatable), built under the "
                                                  "switches that run it as written")
    p.add_argument("--pair", nargs=2, action="append", metavar=("CFG", "OVERRIDES"),
                   help="a --tp-comm-overlap-cfg YAML built under a TransformerConfig overrides YAML as they are, "
                        "consistent or not (repeatable): shows what that pair does to the numerics")
    p.add_argument("--seq-length", type=int, action=Once)
    p.add_argument("--micro-batch-size", type=int, action=Once)
    p.add_argument("--dtype", action=Once)
    p.add_argument("--layers", type=int, default=2, action=Once)
    p.add_argument("--ops", action="store_true", help="also time each linear op alone")
    p.add_argument("--config", action="append", help="run config(s) merged over config/config.yaml (launcher, "
                                                     "timing, presets)")
    p.add_argument("--json", action=Once, help="write the result here")
    p.add_argument("--work-dir", action=Once, help="keep the sessions here (default: a temporary folder)")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("calibrate-window", help="measure this machine's round-to-round noise at several timed "
                                                "windows and choose timing.window_ms (writes a config overlay)")
    p.add_argument("config", nargs="*", help="run config(s) merged over config/config.yaml")
    p.add_argument("--windows", default="500,750,1000,1500", help="candidate windows, ms (default %(default)s)")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per op (default %(default)s)")
    p.add_argument("--ops", type=lambda t: t.split(","), help="comma-separated ops (default: the run's)")
    p.add_argument("--out", help="folder for window.json and window.yaml (default outputs/<run>/calibration)")
    p.add_argument("--run-config", help="a run's config.json (the workflow's calibrate_window rule): its "
                                        "calibration goes to calibration/ beside it")
    p.add_argument("--from", dest="source", metavar="WINDOW_JSON",
                   help="measure nothing: re-derive a recorded calibration (its window.json) with this code")
    p.set_defaults(fn=cmd_calibrate_window)

    from tptune.confirm.entry import HELP as CONFIRM_HELP, add_arguments as add_confirm_arguments
    p = add_confirm_arguments(sub.add_parser("confirm", help=CONFIRM_HELP))
    p.set_defaults(fn=cmd_confirm)

    p = sub.add_parser("failed", help="the measuring outputs of the sessions with a failed setting: "
                                      "snakemake -R $(tptune failed outputs/<run>) re-measures them")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_failed)

    add_check_parser(sub)
    add_predict_parser(sub)
    add_figures_parser(sub)

    p = _step(sub, "check-run", "exit 1 when a stage of the run had no successful member")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="written when every stage had a successful member")
    p.set_defaults(fn=cmd_check_run)

    p = sub.add_parser("analyze", help="metrics of profiler traces: tptune analyze TRACE... [--json] [--plot F]",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=None)
    ap.epilog = ("workflow steps (the Snakemake rules run these on a run's outputs/<run>/config.json;\n"
                 "`tptune <step> -h` for each):\n" + textwrap.fill(", ".join(_STEPS), 78, initial_indent="  ",
                                                                subsequent_indent="  "))
    return ap


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "analyze":
        return analyze_cli(argv[1:])
    args = build_parser().parse_args(argv)
    return args.fn(args)


def main(argv=None) -> int:
    """Every subcommand's entry: an error in what the user gave (TptuneError, a file that cannot be
    read), a closed pipe (``tptune analyze ... | head``) or Ctrl-C ends with one line, never a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = f"tptune {argv[0]}" if argv and not argv[0].startswith("-") else "tptune"
    _interrupt_on_signals()
    try:
        return _dispatch(argv)
    except TptuneError as exc:
        _say(f"tptune: {exc}")
        return 2
    except BrokenPipeError:
        # the reader went away (head, less): stop quietly; point stdout at /dev/null so that Python's
        # flush at exit does not raise again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141     # as a shell reports a process ended by SIGPIPE
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        if argv and argv[0] in MEASURING:
            _say(f"{cmd}: interrupted ({signal.Signals(signum).name}): the case in flight was stopped with its "
                 "worker group; what was recorded before is kept (a session's completed rounds in its "
                 "session.partial.json: the same command, same code and settings, resumes from them)")
        else:
            _say(f"{cmd}: interrupted ({signal.Signals(signum).name}); nothing was being measured")
        return 128 + signum
    except OSError as exc:
        if exc.errno is None:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        _say(f"{cmd}: {where}{exc.strerror or exc}" + (" (the disk is full: free space and run again; what was "
                                                       "written before is kept)" if full else ""))
        return 2


# the subcommands that start worker groups (the others only read and write files)
MEASURING = ("profile", "measure-step", "measure-point", "layer", "measure-packed", "verify", "calibrate-window")


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP end a command as Ctrl-C does, by KeyboardInterrupt, so that a measuring command
    ends its worker group before its GPUs' locks are released (measure.launch) instead of dying at once
    and leaving the group computing an abandoned case."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def _say(line: str) -> None:
    """One line to stderr; where that fails (the job's log is on the full disk), to the console the
    workflow's jobs hold (measure.console), so the line is not lost with the log."""
    console.say(line, log_first=True)


if __name__ == "__main__":
    sys.exit(main())

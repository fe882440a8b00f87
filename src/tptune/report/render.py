"""report.md from the run's files: plan, decisions, every measurement, failures, config files, pictures."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import polars as pl

from tptune.model.memory import markdown_table
from tptune.report.block_account import block_account
from tptune.report.card import answer_card, evidence_tp, plot_summary, summary_rows
from tptune.report.wall_time import wall_time_line
from tptune.cases import parse_case_id
from tptune.stats.efficiency import Efficiency
from tptune.stats.numerics import summary_text
from tptune.stats.wording import classify_ratio, not_a_figure
from tptune.model.plan import plan_summary
from tptune.records import load
from tptune.records.files import write_text_atomic
from tptune.report.confirm_section import confirm_headline, confirm_section, with_confirm_section
from tptune.report.packing_section import packing_headline, packing_section, with_packing_section
from tptune.records.layer_result import decided_layers
from tptune.records.measured_point import decided_points
from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import INF, point_case, point_median
from tptune.records.run_dir import RunDir, layer_session_name, point_session_name
from tptune.records.run_status import run_failures
from tptune.records.sessions import Session, load_sessions, named
from tptune.settings.resolve import Settings
from tptune.trace import plot_timeline

TEMPLATES = Path(__file__).parents[1] / "templates"


def _numerics(n: dict | None) -> str:
    """": 1.32% (1.00x) / 2.26% (0.97x) / 2.34% (0.97x)" of a layer row's numerics (decide.layer.numerics_row),
    with the failing tensors named; nothing for a run judged by TE's pairwise criterion."""
    if not n or n.get("legacy"):
        return ""
    shown = summary_text(n.get("summary") or {})
    text = f": {shown}" if shown else ""
    if n.get("why"):
        text += f"; failed: {n['why']}"
    return text


def _fmt(x, nd=3):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _pct(x):
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if 0.995 <= x < 1 else f"{100 * x:.0f}%"


def _pct_fine(x):
    """Two significant digits: a search's cost against a grid is often well under 1%."""
    return "–" if x is None else f"{100 * x:.2g}%"


def _ratio(r: dict | None) -> str:
    """"0.962 [0.951, 0.973], 4 rounds" from a comparison's ratio record."""
    if not r or r.get("ratio") is None:
        return "–"
    why = not_a_figure(r)
    if why:
        return why
    lo, hi = r.get("lo"), r.get("hi")
    iv = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
    return f"{r['ratio']:.3f}{iv}, {r.get('rounds')} rounds"


def _memory_md(floor: dict | None) -> str:
    return markdown_table(floor) if floor else "Memory not checked."


def _overlap_md(s: Settings) -> str:
    return s.traps_md()


def _point_rows(meas: pl.DataFrame) -> pl.DataFrame:
    """The rows of the TP-point sessions: every reference and finalist measured side by side."""
    return meas.filter(pl.col("session").str.ends_with("/point"))


def _timeline(run: RunDir, case_id: str) -> str | None:
    case = parse_case_id(case_id)
    trace = run.point_session(case.op, case.tp) / case.dir_name / "trace.rank0.json.gz"
    if not trace.exists():
        return None
    png = run.timeline_png(case_id)
    png.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot_timeline(trace, png)
    except Exception as exc:  # noqa: BLE001 - a picture must never sink the report
        return f"(timeline not drawn: {exc})"
    return str(png.relative_to(run.root))


def _op_rows(decisions: dict, meas: pl.DataFrame) -> list[dict]:
    by_case = {r["case"]: r for r in _point_rows(meas).iter_rows(named=True)}
    # a bound measured above what it bounds is a fault: its shares are not shown (listed at the top)
    faulted = {f["bound"] for f in (decisions["meta"].get("measurement") or {}).get("bound_faults") or []}
    behind = (decisions["meta"].get("measurement") or {}).get("host_behind") or []
    rows = []
    for op, rec in decisions["ops"].items():
        winner = (rec.get("winner") or {}).get("case")
        w = by_case.get(winner, {})
        at = evidence_tp(rec)
        pts = decided_points(decisions, op, at)
        none, nocomm = point_case(pts.get("none")), point_case(pts.get("nocomm"))
        t_none = by_case.get(none, {}).get("median_ms")
        t_bound = pts["nocomm"].recorded_median() if pts.get("nocomm") else None
        t_w = w.get("median_ms")
        eff = rec.get("efficiency")
        comm = sum(w.get(f"{p}_comm_ms") or 0 for p in ("fwd", "bwd"))
        overlap = sum(w.get(f"{p}_overlap_ms") or 0 for p in ("fwd", "bwd"))
        rows.append({
            "op": op, "tp": rec["tp"], "evidence_tp": int(at), "case": winner,
            "variant": (rec.get("config") or {}).get("variant"), "note": (rec.get("config") or {}).get("note"),
            "fwd_ms": w.get("fwd_median_ms"), "bwd_ms": w.get("bwd_median_ms"), "total_ms": t_w,
            "none_ms": t_none, "bound_ms": t_bound,
            "bound_faulted": nocomm in faulted,
            # an op that chose no overlap was compared with nothing: no share, not 0%
            "hidden": "– (no overlap chosen)" if eff and eff.get("why") == "no overlap chosen"
            else Efficiency.from_dict(eff).shown() if eff else "–",
            "finalists": rec.get("finalists") or [], "pooled": rec.get("pooled") or {}, "overlap_pct": (overlap / comm) if comm else None,
            "exposed_ms": sum(w.get(f"{p}_exposed_comm_ms") or 0 for p in ("fwd", "bwd")) if w else None,
            "runner_up": (rec.get("runner_up") or {}).get("case"), "margin": rec.get("margin"),
            "vs_runner_up": _ratio((rec.get("vs_runner_up") or {}).get("ratio")),
            "vs_none": _ratio((rec.get("vs_none") or {}).get("ratio")),
            "ties": rec.get("ties") or [], "rounds": rec.get("rounds"), "host_ms": w.get("host_ms"),
            "host_bound": w.get("host_bound"),
            # settings of this op with a batch the host never got ahead of: host time in their figures
            "host_behind": [c for c in behind if c.startswith(f"{op}-tp")],
            "win_by": rec.get("win_by"), "verdict": w.get("verdict"), "verdict_reason": w.get("verdict_reason"),
            "tp_evidence": rec.get("tp_evidence", []),
            "searches": {d: p for d, p in rec.get("searches", {}).items() if not d.endswith("/knobs")},
            "knob_search": rec.get("knob_search") or {},
        })
    return rows


def _member(sessions: list[Session], session: str, case_id: str) -> MeasuredPoint | None:
    """The run.json of ``case_id`` in the session called ``session``, None where it was not recorded."""
    sess = named(sessions, session)
    return sess.points.get(case_id) if sess else None


def _shape_rows(sessions: list[Session], meas: pl.DataFrame, ops: list[dict]) -> list[dict]:
    """Per shape of an op measured at several (worker.harness.run_case): the chosen setting's and the
    no-overlap reference's median at that shape, from their TP-point run.json ("shapes")."""
    by_case = {r["case"]: r for r in _point_rows(meas).iter_rows(named=True)}

    def shapes(case_id):
        r = by_case.get(case_id) if case_id else None
        if not r:
            return []
        p = _member(sessions, r["session"], case_id)
        return p.shapes if p is not None else []

    rows = []
    for o in ops:
        if not o["case"]:
            continue
        won = shapes(o["case"])
        case = parse_case_id(o["case"])
        none = {(s["k_in"], s["n_out"]): s for s in shapes(f"{case.op}-tp{case.tp}-none")}
        for s in won:
            t_none = (none.get((s["k_in"], s["n_out"])) or {}).get("median_ms")
            rows.append({"op": o["op"], "tp": case.tp, "what": s["what"], "k_in": s["k_in"], "n_out": s["n_out"],
                         "layers": s["layers"], "share": s["share"], "chosen_ms": s["median_ms"], "none_ms": t_none,
                         "vs_none": s["median_ms"] / t_none if t_none else None})
    return rows


def _bound_ms(decisions: dict, op: str, tp) -> float | None:
    """An op's no-communication bound at a TP as every figure takes it: the median of its rounds after the
    burn-in round (stats.bound.burned_in, as decisions.json's points hold it), not the measurement table's
    median of every round it ran."""
    m = point_median(decided_points(decisions, op, tp).get("nocomm"))
    return None if m == INF else m


def _comparison(meas: pl.DataFrame, decisions: dict) -> list[dict]:
    """Per (op, TP): none / TE default / presets / tuned / bound medians."""
    rows = []
    for (op, tp), grp in _point_rows(meas).group_by("op", "tp", maintain_order=True):
        med = {r["variant"]: r["median_ms"] for r in grp.iter_rows(named=True)}
        best = point_case(decided_points(decisions, op, tp).get("best"))
        row = {"op": op, "tp": tp, "none": med.get("none"), "bound": _bound_ms(decisions, op, tp),
               "te": med.get("ub.te"), "presets": {v: m for v, m in med.items()
                                                   if v.startswith("ub.") and "+" not in v and v != "ub.te"},
               "best": best, "best_ms": med.get(parse_case_id(best).variant_id) if best else None,
               "n_cases": grp.height, "n_ok": grp.filter(pl.col("status") == "ok").height}
        rows.append(row)
    return sorted(rows, key=lambda r: (r["op"], r["tp"]))


def _limits(meas: pl.DataFrame, decisions: dict) -> list[dict]:
    """Per (op, TP): where the fastest overlapped setting's time above its no-communication bound goes, from
    the profiled steps of its TP point session (fwd+bwd, ms): communication no GEMM covers, GEMM time above
    the bound's (chunked GEMMs, SMs given to communication), and the rest of the traces' wall-time gap (other
    kernels and host gaps; negative where communication ran under other kernels); the larger of the first two
    names what limits the op."""
    rows = []
    margin = decisions["meta"].get("noise_floor") or 0.0
    cols = ("fwd_wall_ms", "bwd_wall_ms", "fwd_gemm_ms", "bwd_gemm_ms", "fwd_exposed_comm_ms", "bwd_exposed_comm_ms")
    if not set(cols) <= set(meas.columns):
        return rows
    pts = _point_rows(meas)
    for (op, tp), grp in sorted(pts.group_by("op", "tp", maintain_order=True), key=lambda g: (g[0][0], g[0][1])):
        rows_ = {r["variant"]: r for r in grp.iter_rows(named=True)}
        bound = rows_.get("nocomm")
        over = [r for v, r in rows_.items() if r["status"] == "ok" and r["median_ms"] and
                parse_case_id(r["case"]).variant.kind in ("ub", "chunked")]
        if not over or not bound:
            continue
        chosen = min(over, key=lambda r: r["median_ms"])
        if any(chosen.get(c) is None or bound.get(c) is None for c in cols):
            continue
        wall = chosen["fwd_wall_ms"] + chosen["bwd_wall_ms"] - bound["fwd_wall_ms"] - bound["bwd_wall_ms"]
        exposed = chosen["fwd_exposed_comm_ms"] + chosen["bwd_exposed_comm_ms"]
        gemm = chosen["fwd_gemm_ms"] + chosen["bwd_gemm_ms"] - bound["fwd_gemm_ms"] - bound["bwd_gemm_ms"]
        parts = {"communication not covered": exposed, "GEMMs slower than the bound's": gemm}
        bound_ms = _bound_ms(decisions, op, tp) or bound["median_ms"]
        rows.append({"op": op, "tp": tp, "setting": chosen["variant"], "timed_ms": chosen["median_ms"],
                     "none_ms": (rows_.get("none") or {}).get("median_ms"), "bound_ms": bound_ms,
                     "gap_ms": wall, "exposed_ms": exposed, "gemm_ms": gemm, "rest_ms": wall - exposed - gemm,
                     "limit": _limit(chosen["median_ms"], bound_ms, wall, parts, margin)})
    return rows


def _limit(timed_ms: float, bound_ms: float, wall_ms: float, parts: dict[str, float], margin: float) -> str:
    """What limits a setting, in words its figures support, where the profiled steps and the timed rounds
    agree: both above the bound, the larger part of the traces' gap; both at it, "at the bound" (the
    timed median within the margin of the bound's). Where they disagree neither names a cause: profiled
    steps above a bound the timed rounds reach, or at or below one they stay beyond the margin above."""
    over = timed_ms / bound_ms if bound_ms else None
    if wall_ms > 0:
        if over is None or over > 1:
            return max(parts, key=parts.get)
        return (f"not told: the profiled steps read {wall_ms:.3f} ms above the bound, the timed rounds at or "
                f"below it ({over:.2f}× it)")
    if over is None or over <= 1 + margin:
        return "at the bound"
    return f"not told: the profiled steps read at or below the bound, the timed rounds {over:.2f}× it"


def _sums(meas: pl.DataFrame, decisions: dict) -> list[dict]:
    """Per TP measured for every op: the sum over ops of each reference and of the fastest setting."""
    ops = list(decisions["ops"])
    meas = _point_rows(meas)
    by = {(r["op"], r["tp"], r["variant"]): r["median_ms"] for r in meas.iter_rows(named=True)}
    rows = []
    for tp in sorted({t for t in meas["tp"].to_list()}):
        def total(variant):
            vals = [_bound_ms(decisions, op, tp) if variant == "nocomm" else by.get((op, tp, variant)) for op in ops]
            return None if any(v is None for v in vals) else sum(vals)
        fastest, variants = [], []
        for op in ops:
            f = decided_points(decisions, op, tp).get("fastest")
            fastest.append(f and by.get((op, tp, parse_case_id(f.case).variant_id)))
            variants.append(f and parse_case_id(f.case).variant_id)
        presets = sorted({v for (_, t, v) in by if t == tp and v.startswith("ub.") and "+" not in v and v != "ub.te"})
        rows.append({"tp": tp, "none": total("none"), "te": total("ub.te"),
                     "presets": {p: total(p) for p in presets},
                     "tuned": None if any(v is None for v in fastest) else sum(fastest), "bound": total("nocomm"),
                     "tuned_is_none": all(v == "none" for v in variants)})
    return rows


def _calibration(run: RunDir) -> dict | None:
    """The window calibration's choice (timing.window_ms: auto), without its recorded rounds."""
    rec = load.calibration(run)
    return {k: rec.get(k) for k in ("window_ms", "why", "device", "gpu")} if rec else None


_SESSION_KEYS = ("members", "contenders", "always", "canary", "evidence", "margin", "tie_margin", "injected_faults",
                 "check", "layer", "presets")   # set by the session's role (the layer stage: check, layer, presets)


def _measured_with(sessions: list[dict]) -> list[dict]:
    """The measurement settings the sessions recorded (search.measurement), grouped: one group where
    every session was measured alike, else one per distinct setting with its sessions. Only what a
    session's own role sets (members, margins, evidence) is left out. ``sessions``: the run's
    session.json records."""
    groups: dict[str, dict] = {}
    for sess in sessions:
        rec = sess.get("settings")
        common = ({k: v for k, v in rec.items() if k not in _SESSION_KEYS and k != "model"} if rec
                  else None)
        key = json.dumps(common, sort_keys=True)
        g = groups.setdefault(key, {"settings": common, "sessions": []})
        g["sessions"].append(sess["session"])
    out = []
    for g in groups.values():
        st = g["settings"]
        if st is None:
            text = "not recorded (a session measured before tptune recorded its settings)"
        else:
            tm = st.get("timing") or {}
            text = ", ".join(f"{k}={tm[k]}" for k in sorted(tm)) + f"; check={st.get('check')}" + (
                f"; layer {st['layer']}" if st.get("layer") else "") + (
                f"; launcher {st['launcher']}" if st.get("launcher") else "")
        out.append({"text": text, "sessions": g["sessions"]})
    return out


def driver_words(raw) -> str:
    """The driver version as nvidia-smi gives it (one line per GPU), said once: "driver 580.159.04"; where the GPUs
    differ, each GPU's on one line."""
    versions = [v.strip() for v in str(raw or "").splitlines() if v.strip()]
    if len(set(versions)) <= 1:
        return f"driver {versions[0] if versions else '?'}"
    return "drivers " + ", ".join(f"GPU {i} {v}" for i, v in enumerate(versions))


def _environment(s: Settings) -> jinja2.Environment:
    env_t = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)
    env_t.filters.update(driver=driver_words, numerics=_numerics, fmt=_fmt, pct=_pct, pct_fine=_pct_fine, ratio=_ratio,
                         words=lambda r: classify_ratio(r, s.decision.noise_floor),
                         efficiency=lambda d: Efficiency.from_dict(d).shown() if d else "–")
    return env_t


def card_markdown(s: Settings, run: RunDir, decisions: dict, failures: list[dict]) -> str:
    """The answer card alone, as report.md opens with it (without the summary figure and its table)."""
    return _environment(s).get_template("answer_card.md.j2").render(
        card=answer_card(s, run, decisions, failures), summary_rows=[], summary_png=None,
        layer_num_layers=int(s.layer.num_layers))


def render_report(s: Settings, run: RunDir, out: Path) -> Path:
    plan = load.plan(run)
    meas = load.measurements(run)
    decisions = load.decisions(run)
    recorded = load_sessions(run)
    ops = _op_rows(decisions, meas)
    for row in ops:
        row["timeline"] = _timeline(run, row["case"]) if row["case"] else None
    status = run_failures(recorded)   # every failed member, every retried attempt, every stage none of whose members ran
    failures = status["members"]
    for row in ops:     # the members of its TP point that failed: the pick was not compared with them
        row["uncompared"] = [f["case"] for f in failures
                             if f["session"] == point_session_name(row["op"], row["evidence_tp"])]
    runs = meas.filter(pl.col("wall_s").is_not_null())
    gpu_s = float((runs["wall_s"] * runs["tp"]).sum()) if runs.height else 0.0
    started = int(runs["server_started"].fill_null(False).sum()) if runs.height else 0
    env = {}
    for r in meas.iter_rows(named=True):
        p = _member(recorded, r["session"], r["case"])
        if p is not None:
            env = p.environment or {}
            if env:
                break
    sessions = [x.record for x in recorded]
    session_rows = [{"session": x["session"], "members": len(x["members"]), "rounds": x["rounds"],
                     "stop": x["stop"], "wall_s": x["wall_s"], "gpu_s": x.get("gpu_s"),
                     "failed": x.get("failed") or []} for x in sessions]
    gpu_s = sum(x.get("gpu_s") or 0.0 for x in sessions) or gpu_s
    env_t = _environment(s)
    card = answer_card(s, run, decisions, failures)
    shown = {f["name"] for f in card["load"]} if card["files"]["recorded"] else None

    def listed_text(name):
        """An unsuffixed file's text where the card lists it (a run recorded before its files were listed:
        where it exists)."""
        return load.text(run.file(name)) if shown is None or name in shown else None
    summary = summary_rows(recorded, decisions)
    layer_sessions = {int(tp): named(recorded, layer_session_name(tp)) for tp in decided_layers(decisions["meta"])}
    png = plot_summary(summary, run.summary_png)
    text = env_t.get_template("report.md.j2").render(
        card=card, summary_rows=summary, summary_png=str(png.relative_to(run.root)) if png else None,
        layer_num_layers=int(s.layer.num_layers),
        s=s, model=s.model.model, workload=s.model.workload, plan=plan.to_dicts(),
        plan_summary=plan_summary(plan).to_dicts(), decisions=decisions, ops=ops,
        comparison=_comparison(meas, decisions), limits=_limits(meas, decisions), block_accounts=block_account(decisions, layer_sessions), sums=_sums(meas, decisions), cases=meas.to_dicts(),
        tp_files=sorted(p.name for p in run.files("tp_comm_overlap_cfg.tp*.yaml")), failures=failures,
        gpu_s=gpu_s, n_cases=meas.height, n_started=started, env=env, yaml_text=listed_text("tp_comm_overlap_cfg.yaml"),
        chunk_text=listed_text("chunked_cfg.yaml"), run_dir=run.root, sessions=session_rows,
        flags_text=listed_text("megatron_flags.txt"),
        tps_measured=sorted({int(t) for rec in decisions["ops"].values() for t in rec.get("points") or {}}),
        measurement=decisions["meta"].get("measurement") or {},
        memory_md=_memory_md(decisions["meta"].get("memory")),
        overlap_md=_overlap_md(s),
        layer=decided_layers(decisions["meta"]),
        calibration=_calibration(run), shape_rows=_shape_rows(recorded, meas, ops),
        status=status, measured_with=_measured_with(sessions), wall_time=wall_time_line(run, sessions),
    )
    text = with_confirm_section(text, confirm_section(env_t, run), confirm_headline(run))
    text = with_packing_section(text, packing_section(env_t, run, int(s.layer.num_layers), s.device != "cuda"),
                                packing_headline(run))
    write_text_atomic(out, text)
    return out

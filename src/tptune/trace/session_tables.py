"""The run's tables from its recorded sessions: per session, every member's trace metrics (one table, a
``case`` column telling them apart); per run, one row per setting per session with its timings, host
figures, trace metrics and verdict. emit.tables writes them."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from tptune.cases import parse_case_id
from tptune.errors import TraceError
from tptune.records.measured_point import MeasuredPoint, TimingSummary
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session, read_member, read_point, read_session_record
from tptune.trace.classify import fp8_patterns
from tptune.trace.metrics import summarize, trace_metrics
from tptune.trace.verdict import overlap_verdict

PHASE_PREFIX = {"forward": "fwd", "backward": "bwd"}
METRICS = ("wall_ms", "gemm_ms", "comm_ms", "overlap_ms", "exposed_comm_ms", "other_ms")


def _patterns(run: MeasuredPoint) -> dict | None:
    """FP8 runs: their amax all-reduces are not TP communication (trace.classify.fp8_patterns)."""
    w = run.workload
    return fp8_patterns(w.get("recipe")) if w.get("dtype") == "fp8" else None


def _case_frame(run: MeasuredPoint, base: Path) -> pl.DataFrame:
    """Metrics per rank/step/phase of one case's traces; a failed case or unreadable trace gives a
    one-row frame with ``error`` set, so the run goes on and the table shows why."""
    error, df = None, None
    if run.status != "ok":
        error = f"case failed: {run.error_kind}"
    elif not run.traces:
        error = "no traces recorded (timing.profile_steps = 0)"
    else:
        try:
            df = trace_metrics([base / t for t in run.traces], patterns=_patterns(run))
        except (TraceError, ValueError) as exc:
            error = f"trace analysis failed: {exc}"
    if df is None:
        df = pl.DataFrame({"error": [error]})
    else:
        df = df.with_columns(pl.lit(None, dtype=pl.String).alias("error"))
    df = df.with_columns(pl.lit(run.case).alias("case"))
    for col in df.columns:  # Parquet has no type for sets/objects: stream sets become strings
        if df[col].dtype == pl.Object or isinstance(df[col].dtype, pl.List):
            df = df.with_columns(pl.col(col).cast(pl.List(pl.String)).list.join(",").alias(col))
    return df


def case_table(run_json: Path) -> pl.DataFrame:
    """The trace metrics of one case (its run.json)."""
    return _case_frame(read_point(run_json), run_json.parent)


def session_table(session: Path) -> pl.DataFrame:
    """Every member's trace metrics of one session in one table (a ``case`` column tells them apart)."""
    sess = read_session_record(session)
    frames = []
    for cid, rel in (sess.get("runs") or {}).items():
        frames.append(_case_frame(read_member(session, sess, cid, rel), (session / rel).parent))
    return pl.concat(frames, how="diagonal_relaxed")


def case_summary(analysis: pl.DataFrame) -> tuple[pl.DataFrame | None, str | None]:
    if "error" in analysis.columns and analysis["error"].drop_nulls().len():
        return None, analysis["error"].drop_nulls()[0]
    return summarize(analysis.drop("error", "case")), None


def _flatten_summary(summary: pl.DataFrame | None) -> dict:
    out = {}
    if summary is None:
        return out
    for row in summary.iter_rows(named=True):
        pre = PHASE_PREFIX.get(row["phase"], row["phase"])
        for m in METRICS:
            out[f"{pre}_{m}"] = row.get(f"{m}_max")
    return out


def _timing(run: MeasuredPoint, key: str, field: str):
    t = run.summary(key)
    return None if t is None else getattr(t, field)


def round_costs(run: MeasuredPoint) -> dict:
    """Where a member's rounds went, in seconds summed over its rounds (the slowest rank of each): the
    build (init_s), the measurement (measure_s: warm-up, probe, hold, pre-roll, timed window, profile,
    check), of which the timed window's GPU time (timed_s) and the hold (hold_s: the sleep and the
    pre-roll, GPU time), and the teardown (close_s). held_s - init_s - measure_s - close_s is the
    request's handling and round trip."""
    launch = run.launch or {}
    samples = (run.timing.get("total_ms") or TimingSummary()).samples
    batches = run.host_batches
    slept = [b.get("slept_ms") for b in batches]
    return {"init_s": launch.get("init_s"), "measure_s": launch.get("measure_s"), "close_s": launch.get("close_s"),
            "timed_s": sum(samples) / 1e3 if samples else None,
            "hold_s": sum(slept) / 1e3 if slept and all(x is not None for x in slept) else None}


def measurement_table(run: RunDir, session_jsons: list[Path]) -> pl.DataFrame:
    """One row per setting per session: timing (per-round medians), host figures, trace metrics, verdict."""
    rows, summaries = [], {}
    for sj in session_jsons:
        sj = Path(sj)
        runs = load_session(sj.parent).points
        apath = run.session_analysis(sj.parent)
        analysis = pl.read_parquet(apath) if apath.exists() else None
        sname = run.session_name(sj.parent)
        for cid, r in runs.items():
            case = parse_case_id(cid)
            if analysis is not None and "case" in analysis.columns:
                summary, aerr = case_summary(analysis.filter(pl.col("case") == cid))
            else:
                summary, aerr = None, "not analysed"
            summaries[(sname, cid)] = summary
            launch = r.launch or {}
            status = r.status if r.status != "ok" or summary is not None or (aerr or "").startswith("no traces") \
                else "failed"
            rounds = (r.timing.get("total_ms") or TimingSummary()).rounds
            rows.append({
                "session": sname, "case": cid, "op": case.op, "tp": case.tp, "variant": case.variant_id,
                "kind": case.variant.kind, "status": status,
                "error_kind": r.error_kind or (None if status == "ok" else "trace"),
                "error": (r.error_message or (aerr if status != "ok" else None)),
                "median_ms": _timing(r, "total_ms", "median"), "p10_ms": _timing(r, "total_ms", "p10"),
                "p90_ms": _timing(r, "total_ms", "p90"), "spread": _timing(r, "total_ms", "spread"),
                "n": _timing(r, "total_ms", "n"), "rounds": len(rounds or ()),
                "round_spread": (max(rounds) / min(rounds) - 1) if rounds else None,
                "fwd_median_ms": _timing(r, "fwd_ms", "median"), "bwd_median_ms": _timing(r, "bwd_ms", "median"),
                "host_ms": r.host_ms, "host_bound": r.host_bound, "host_ahead": r.host_ahead,
                "correct": r.correct,
                "server_started": launch.get("server_started"), "case_s": launch.get("case_s"),
                "wall_s": r.wall_s, **round_costs(r),
                **_flatten_summary(summary), "analysis_error": aerr,
            })
    for row in rows:  # verdict against the no-overlap case of the same session
        base = summaries.get((row["session"], f"{row['op']}-tp{row['tp']}-none"))
        mine = summaries.get((row["session"], row["case"]))
        if row["kind"] in ("chunked", "ub") and base is not None and mine is not None:
            row["verdict"], row["verdict_reason"] = overlap_verdict(mine, base)
        else:
            row["verdict"], row["verdict_reason"] = None, None
    return pl.DataFrame(rows, infer_schema_length=None).sort("op", "tp", "session", "median_ms", nulls_last=True)

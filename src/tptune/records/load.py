"""The run's derived records, read at the edge: search results, TP points, the layer stage's records, the
TP point's trace analysis, decisions.json (RunDir names where each lies). The sessions themselves:
records.sessions."""
from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl

from tptune.errors import RecordError
from tptune.records.layer_result import LayerResult
from tptune.records.measured_point import MeasuredPoint
from tptune.records.run_dir import RunDir

MAX_DEPTH = 64   # the deepest record tptune writes nests 9 levels (decisions.json)
_TOO_DEEP = object()


def _depth_exceeds(obj, limit: int) -> bool:
    """Whether ``obj`` nests mappings and lists deeper than ``limit`` (walked without recursion)."""
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


def read_json(path: str | Path):
    """A JSON record a run wrote, or errors.RecordError naming the file (and the link it is, where it is one)
    when it is not one: truncated, not JSON, not text, nested deeper than any record. A missing or unreadable
    file raises the OSError."""
    path = Path(path)
    name = f"{path} (a link to {os.readlink(path)})" if path.is_symlink() else str(path)
    data = path.read_bytes()
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecordError(f"{name}: not JSON (not UTF-8 text: byte {exc.start}); expected a record tptune "
                          "writes") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{name}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): truncated, "
                          "or not a record tptune writes") from None
    except RecursionError:
        obj = _TOO_DEEP
    if obj is _TOO_DEEP or _depth_exceeds(obj, MAX_DEPTH):
        raise RecordError(f"{name}: nested deeper than {MAX_DEPTH} levels, which no record tptune writes is")
    return obj


def tp_results(run: RunDir, op: str, tp: int) -> list[dict]:
    """Each search's result at (op, TP): what the TP point measures."""
    return read_json(run.tp_results(op, tp))


POINT_FIELDS = ("none", "nocomm", "best", "fastest_overlapped")   # a TP point's (point.json) single points
POINT_MAPS = ("references", "candidates")                          # and its {name: point} maps


def typed_tp_point(rec: dict, source: str) -> dict:
    """A TP point's record (point.json, decide.tp_point.tp_point) with its measured points typed."""
    def one(p, where):
        return None if p is None else MeasuredPoint.from_dict(p, f"{source}: {where}")
    out = dict(rec)
    for k in POINT_FIELDS:
        if k in rec:
            out[k] = one(rec[k], k)
    for k in POINT_MAPS:
        if k in rec:
            out[k] = {c: one(p, f"{k}.{c}") for c, p in (rec[k] or {}).items()}
    return out


def tp_point(run: RunDir, op: str, tp: int) -> dict:
    """point.json of (op, TP), its measured points typed."""
    path = run.tp_point(op, tp)
    return typed_tp_point(read_json(path), str(path))


def layer_results(run: RunDir, tps) -> dict[int, LayerResult]:
    """{tp: layer/tp<N>.json} of the TP sizes in ``tps`` whose block was recorded."""
    return {t: LayerResult.from_dict(read_json(run.layer_json(t))) for t in tps if run.layer_json(t).exists()}


def point_analysis(run: RunDir, op: str, tp: int) -> pl.DataFrame | None:
    """The trace analysis of the TP point's session (analysis/<op>/tp<N>/point.parquet), None when missing."""
    path = run.point_analysis(op, tp)
    return pl.read_parquet(path) if path.exists() else None


def decisions(run: RunDir) -> dict:
    return read_json(run.decisions_json)


def plan(run: RunDir) -> pl.DataFrame:
    return pl.read_parquet(run.plan_parquet)


def measurements(run: RunDir) -> pl.DataFrame:
    return pl.read_parquet(run.measurements_parquet)


def calibration(run: RunDir) -> dict | None:
    """The run's window calibration record (cli.calibrate), or None where it has none."""
    try:
        return read_json(run.calibration_json)
    except (OSError, ValueError):
        return None


def text(path: Path) -> str | None:
    """A file's text, None where it does not exist."""
    return path.read_text() if path.exists() else None

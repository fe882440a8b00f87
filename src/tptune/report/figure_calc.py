"""The ``calc`` figure kind (report.quoted_figures): arithmetic over recorded values, for a quoted figure that
is a sum, a ratio, a difference or an aggregate of recorded numbers (a wall time less a stage, 1 - a ratio, the
root mean square of per-op spreads, the median of per-call ratios), so that no such figure is worked out by
hand.

    name: {kind: calc, expr: "1 - a", values: {a: {file: run/decisions.json, key: ops.fc2.win_by}},
           format: "{value:.1%}"}

Each of ``values`` reads one recorded value: ``file`` (under results/) with ``key`` (a dotted JSON path, list
indices as numbers) or, for a .txt, its first number; ``lines: true`` reads a JSON-lines file into a list of
records. A list of records, or a mapping, is narrowed with ``field`` (that field of each record / value of each
entry; ``where: {field: value}`` keeps the matching records first). ``expr`` is arithmetic over the names
(+ - * / ** and parentheses, numbers) and the functions sum, mean, median, min, max, rms, len, sqrt, abs; an
operation on two lists of equal length, or a list and a number, works element by element (the median of
per-call ratios: ``median(a / b)``). The result (a number, or a list of them) is formatted as ``value``.
"""
from __future__ import annotations

import ast
import json
import math
import operator
import statistics
from pathlib import Path

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}
_FUN = {"sum": sum, "mean": statistics.fmean, "median": statistics.median, "min": min, "max": max,
        "rms": lambda xs: math.sqrt(statistics.fmean([x * x for x in xs])), "len": len, "sqrt": math.sqrt,
        "abs": abs}


def _key(v, key: str, where: str):
    for k in key.split("."):
        try:
            v = v[int(k)] if isinstance(v, list) else v[k]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{where}: no {k!r} on the way to {key!r}") from None
    return v


def read_value(results: Path, d: dict, name: str):
    """One named value of a calc figure (module doc): a number or a list of numbers."""
    path = results / d["file"]
    where = f"values.{name} ({d['file']})"
    if d.get("lines"):
        v = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    elif path.suffix == ".json":
        v = json.loads(path.read_text())
    else:
        v = float(path.read_text().split()[0])
    if d.get("key"):
        v = _key(v, str(d["key"]), where)
    if isinstance(v, dict) and "field" not in d:
        v = list(v.values())
    if d.get("where"):
        v = [r for r in v if all(r.get(k) == want for k, want in d["where"].items())]
    if "field" in d:
        rows = v.values() if isinstance(v, dict) else v
        v = [_key(r, str(d["field"]), where) for r in rows]
    if isinstance(v, list):
        if not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            raise ValueError(f"{where}: expected numbers, got {str(v)[:80]}")
        return [float(x) for x in v]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{where}: expected a number, got {str(v)[:80]}")
    return float(v)


def _apply(op, a, b):
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise ValueError(f"element-wise operation on lists of {len(a)} and {len(b)} values")
        return [op(x, y) for x, y in zip(a, b)]
    if isinstance(a, list):
        return [op(x, b) for x in a]
    if isinstance(b, list):
        return [op(a, y) for y in b]
    return op(a, b)


def evaluate(expr: str, names: dict):
    """``expr`` (module doc) over ``names``; ValueError for anything else."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return float(n.value)
        if isinstance(n, ast.Name):
            if n.id not in names:
                raise ValueError(f"expr: {n.id!r} is none of values ({', '.join(names)})")
            return names[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            return _apply(_BIN[type(n.op)], ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            v = ev(n.operand)
            return [-x for x in v] if isinstance(v, list) else -v
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUN and not n.keywords):
            args = [ev(a) for a in n.args]
            if n.func.id in ("sqrt", "abs"):
                (x,) = args
                return [_FUN[n.func.id](v) for v in x] if isinstance(x, list) else _FUN[n.func.id](x)
            return _FUN[n.func.id](args[0] if len(args) == 1 else args)
        raise ValueError(f"expr: {ast.unparse(n)!r} is not arithmetic over the values (module doc)")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"expr {expr!r}: {exc.msg}") from None
    return ev(tree)


def calc(results: Path, d: dict):
    """The figure's number (or list): ``expr`` over its ``values``."""
    names = {k: read_value(results, v, k) for k, v in (d.get("values") or {}).items()}
    return evaluate(str(d["expr"]), names)

"""The ``calc`` figure kind (report.quoted_figures): arithmetic over recorded values, for a quoted figure that
is a sum, a ratio, a difference or an aggregate of recorded numbers (a wall time less a stage, 1 - a ratio, the
root mean square of per-op spreads, the median of per-call ratios), so that no such figure is worked out by
hand.

    name: {kind: calc, expr: "1 - a", values: {a: {file: run/decisions.json, key: ops.fc2.win_by}},
           format: "{value:.1%}"}

Each of ``values`` reads one recorded value: ``file`` (under results/) with ``key`` (a dotted JSON path, list
indices as numbers; a list of segments where a key holds a dot, e.g. ``[searches, tp2/wgrad.bulk, 0]``) or, for
a .txt, its first number, or with ``match`` (a regular expression, ``^`` at each line) its first group's number
where it first matches: a figure a benchmark only printed (a log's wall time, a cell of a printed table); ``lines: true`` reads a JSON-lines file into a list of records, ``csv: true`` a CSV file
(a measurements.csv) into records, numbers parsed. ``glob`` instead of ``file`` reads every matching file
(sorted) the same way and lists the values, one a file (a run's cases/*/run.json). A list of records, or a
mapping, is narrowed with ``where: {field: value}`` (the matching records) and ``field`` (that field of each
record / value of each entry); ``count: true`` then reads how many items the value holds (of each record's field,
with ``field``: a session.json's members). ``expr`` is arithmetic over the names (+ - * / ** and parentheses, numbers) and
the functions sum, mean, median, min, max, rms, len, sqrt, abs, log, exp, t975 (Student's two-sided 97.5%
quantile at df: stats.rounds.t975, as the package's intervals), concat (lists joined), part(x, n, i, j) (items
i to j - 1 of every consecutive group of n: each round's first five of ten iterations), group_max(x, n) (the
largest of every consecutive group of n) and lt, le, gt, ge (1 or 0,
element-wise: ``sum(lt(hi, 1))`` counts the values below 1); an operation on two lists of equal length, or a
list and a number, works element by element (the median of per-call ratios: ``median(a / b)``). A value may
instead name a figure kind whose fields are numbers (window, first_member, burn_in, stopping_replay, ops_hidden:
``{kind: stopping_replay, field: saved}``), so that a figure derived from another's definition reuses it. The
result (a number, or a list of them) is formatted as ``value``.
"""
from __future__ import annotations

import ast
import csv
import io
import json
import math
import operator
import re
import statistics
from pathlib import Path

from tptune.stats.rounds import t975

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}
_FUN = {"sum": sum, "mean": statistics.fmean, "median": statistics.median, "min": min, "max": max,
        "rms": lambda xs: math.sqrt(statistics.fmean([x * x for x in xs])), "len": len}
_ONE = {"sqrt": math.sqrt, "abs": abs, "log": math.log, "exp": math.exp, "t975": t975}     # element-wise
_CMP = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}        # 1.0 / 0.0


def _groups(x, n) -> list[list[float]]:
    """``x`` cut into consecutive groups of ``n`` (a run.json's samples into its rounds of n iterations)."""
    k = int(n)
    if not isinstance(x, list) or k != n or k < 1 or len(x) % k:
        raise ValueError(f"groups of {n}: expected a list whose length ({len(x) if isinstance(x, list) else 1}) "
                         "a positive whole number divides")
    return [x[i:i + k] for i in range(0, len(x), k)]


def _part(x, n, i, j):
    """Items i to j - 1 of every group of n, in order (the first 5 of each round's 10 iterations)."""
    return [v for g in _groups(x, n) for v in g[int(i):int(j)]]


_GROUP = {"part": _part, "group_max": lambda x, n: [max(g) for g in _groups(x, n)]}


def walk_key(v, key, where: str):
    """``v``'s value at ``key`` (module doc: dotted, list indices as numbers, or a list of segments)."""
    for k in (key if isinstance(key, list) else str(key).split(".")):
        try:
            v = v[int(k)] if isinstance(v, list) else v[k]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{where}: no {k!r} on the way to {key!r}") from None
    return v


def _number(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return x


def _read(path: Path, d: dict, where: str):
    if d.get("match"):
        m = re.search(d["match"], path.read_text(), re.M)
        if m is None or not m.groups():
            raise ValueError(f"{where}: {d['match']!r} matches no line (or has no group)")
        try:
            return float(m.group(1))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {d['match']!r} matched {m.group(1)!r}, not a number") from None
    if d.get("lines"):
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if d.get("csv"):
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(path.read_text()))]
    if path.suffix == ".json":
        return json.loads(path.read_text())
    try:
        return float(path.read_text().split()[0])
    except (IndexError, ValueError):
        raise ValueError(f"{where}: no number first in the file") from None


def _narrow(v, d: dict, where: str):
    if d.get("key") is not None:
        v = walk_key(v, d["key"], where)
    if d.get("where"):
        v = [r for r in v if all(r.get(k) == want for k, want in d["where"].items())]
    if "field" in d:
        rows = v.values() if isinstance(v, dict) else v
        v = [walk_key(r, d["field"], where) for r in rows]
    elif isinstance(v, dict) and not d.get("count"):
        v = list(v.values())
    if d.get("count"):     # how many items: of the value, or of each record's field
        v = [len(x) for x in v] if "field" in d else len(v)
    return v


def read_value(results: Path, d: dict, name: str):
    """One named value of a calc figure (module doc): a number or a list of numbers."""
    if d.get("glob"):
        where = f"values.{name} ({d['glob']})"
        paths = sorted(results.glob(d["glob"]))
        if not paths:
            raise ValueError(f"{where}: no file matches")
        v = []
        for path in paths:
            x = _narrow(_read(path, d, where), d, f"{where}: {path.relative_to(results)}")
            v += x if isinstance(x, list) else [x]
    else:
        where = f"values.{name} ({d['file']})"
        v = _narrow(_read(results / d["file"], d, where), d, where)
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
        name = n.func.id if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and not n.keywords else None
        if name in _GROUP:
            x, *rest = [ev(a) for a in n.args]
            return _GROUP[name](x, *rest)
        if name in _FUN or name in _ONE or name in _CMP or name == "concat":
            args = [ev(a) for a in n.args]
            if name in _FUN:
                return _FUN[name](args[0] if len(args) == 1 else args)
            if name == "concat":
                return [x for a in args for x in (a if isinstance(a, list) else [a])]
            if name in _CMP:
                a, b = args
                return _apply(lambda x, y: float(_CMP[name](x, y)), a, b)
            (x,) = args
            return [_ONE[name](v) for v in x] if isinstance(x, list) else _ONE[name](x)
        raise ValueError(f"expr: {ast.unparse(n)!r} is not arithmetic over the values (module doc)")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"expr {expr!r}: {exc.msg}") from None
    return ev(tree)


def calc(results: Path, d: dict, fields=None):
    """The figure's number (or list): ``expr`` over its ``values``. ``fields`` (report.quoted_figures) gives
    the fields of a value that names a figure kind instead of a file (``kind:`` and its spec, ``field:``)."""
    names = {}
    for k, v in (d.get("values") or {}).items():
        if "kind" in v:
            if fields is None:
                raise ValueError(f"values.{k}: a kind's fields need the figures' resolver")
            got = fields(v)
            if v.get("field") not in got:
                raise ValueError(f"values.{k}: field {v.get('field')!r} is none of {', '.join(got)}")
            names[k] = float(got[v["field"]])
        else:
            names[k] = read_value(results, v, k)
    return evaluate(str(d["expr"]), names)

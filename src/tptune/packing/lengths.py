"""The per-sequence token counts (prompt + response) of the user's rollouts: ``workload.packing.lengths``.

Forms (docs/packing.md has them with examples; a relative path is read from ``base_dir``):

- a path (a string) to a text file, one integer a line (blank lines and lines starting with ``#`` skipped);
  a ``.csv``/``.parquet`` file with one column, or a ``.jsonl`` file whose lines are bare integers, may be
  given the same way;
- ``{file: x.csv, column: name}`` or ``{file: x.parquet, column: name}``: a column of a CSV or Parquet file;
- ``{file: x.jsonl, field: name}``: a field of each line of a JSON-lines file;
- ``{histogram: {values: [...], counts: [...]}}``: ``counts[i]`` sequences of exactly ``values[i]`` tokens;
- ``{histogram: {edges: [...], counts: [...]}}``: ``counts[i]`` sequences in the bin ``[edges[i],
  edges[i+1])``, spread evenly over it (deterministic: the j-th of c takes ``edges[i] + floor((j + 0.5) *
  width / c)``), so ``len(edges) == len(counts) + 1``.

Every length must be a positive integer (a whole-number float in a CSV/Parquet/JSON column is taken as
that integer; 12.5, 0, -3, an empty cell are refused naming the line or row). Errors are ConfigErrors
naming ``workload.packing.lengths`` and the file.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tptune.errors import ConfigError

FIELD = "workload.packing.lengths"
MAX_SEQUENCES = 100_000_000          # a histogram's counts expand to arrays: refuse what would not fit memory
_TEXT = {".txt", ".lst", ".dat", ""}
_FILE_KEYS = {"file", "column", "field"}


def load_lengths(spec: dict | str, base_dir: Path) -> np.ndarray:
    """The sequence lengths (int64, in file order) that ``spec`` names.

    ``spec``: the ``workload.packing`` mapping (its ``lengths`` is read, and where it gives ``capacities``
    or ``max_token_len``, a sequence longer than every candidate capacity T is refused: the largest of
    ``capacities``, else twice ``max_token_len``, the default candidates' top; capacity.candidate_capacities),
    or a ``lengths`` value itself (a path or one of the mappings of the module doc)."""
    packing = spec if isinstance(spec, dict) and "lengths" in spec else None
    value = packing["lengths"] if packing is not None else spec
    lengths, where = _read(value, Path(base_dir))
    if packing is not None:
        _check_longest(lengths, where, packing)
    return lengths


# --- reading ---------------------------------------------------------------------------------------------

def _read(value: Any, base_dir: Path) -> tuple[np.ndarray, "_Where"]:
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(FIELD, [f"field '{FIELD}' is empty: expected a file path or a mapping "
                                      "(file + column/field, or histogram)"])
        return _read_file(_path(value, base_dir), None, None)
    if not isinstance(value, dict):
        raise ConfigError(FIELD, [f"field '{FIELD}' = {value!r}: expected a file path, {{file, column}}, "
                                  "{file, field} or {histogram: {values|edges, counts}}"])
    if "histogram" in value:
        extra = set(value) - {"histogram"}
        if extra:
            raise ConfigError(FIELD, [f"field '{FIELD}': unknown key(s) {sorted(extra)} beside 'histogram'"])
        return _histogram(value["histogram"])
    extra = set(value) - _FILE_KEYS
    if extra or "file" not in value:
        raise ConfigError(FIELD, [f"field '{FIELD}': expected keys file and column (CSV/Parquet) or field "
                                  f"(JSONL), or histogram; got {sorted(value)}"])
    if "column" in value and "field" in value:
        raise ConfigError(FIELD, [f"field '{FIELD}': give column (CSV/Parquet) or field (JSONL), not both"])
    for key in ("file", "column", "field"):
        if key in value and (not isinstance(value[key], str) or not value[key]):
            raise ConfigError(FIELD, [f"field '{FIELD}.{key}' = {value[key]!r}: expected a non-empty string"])
    return _read_file(_path(value["file"], base_dir), value.get("column"), value.get("field"))


def _path(name: str, base_dir: Path) -> Path:
    p = Path(name).expanduser()
    p = p if p.is_absolute() else base_dir / p
    if not p.is_file():
        raise ConfigError(FIELD, [f"field '{FIELD}': file {p} not found" + (" (a folder)" if p.is_dir() else "")])
    return p


class _Where:
    """Names a length's place for messages: 'line 7 of x.txt', 'row 3 of x.csv (column n)', ..."""

    def __init__(self, source: str, unit: str, positions: np.ndarray | None = None, first: int = 1):
        self.source, self.unit, self.positions, self.first = source, unit, positions, first

    def at(self, i: int) -> str:
        pos = int(self.positions[i]) if self.positions is not None else i + self.first
        return f"{self.unit} {pos} of {self.source}"


def _read_file(path: Path, column: str | None, field: str | None) -> tuple[np.ndarray, _Where]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        if field:
            raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} is a CSV file: name a column, not a field"])
        return _read_table(path, column, "csv")
    if suffix in (".parquet", ".pq"):
        if field:
            raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} is a Parquet file: name a column, not a field"])
        return _read_table(path, column, "parquet")
    if suffix in (".jsonl", ".ndjson"):
        if column:
            raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} is a JSON-lines file: name a field, not a "
                                      "column"])
        return _read_jsonl(path, field)
    if suffix in _TEXT:
        if column or field:
            raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} is a text file of one integer a line; "
                                      "column/field apply to CSV/Parquet/JSONL files"])
        return _read_text(path)
    raise ConfigError(FIELD, [f"field '{FIELD}': {path.name}: unknown file type {suffix!r} (expected .txt with "
                              "one integer a line, .csv, .parquet or .jsonl)"])


def _read_text(path: Path) -> tuple[np.ndarray, _Where]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(FIELD, [f"field '{FIELD}': cannot read {path}: {exc}"]) from None
    lines = text.splitlines()
    keep = [(i, s) for i, s in enumerate(map(str.strip, lines)) if s and not s.startswith("#")]
    where = _Where(path.name, "line", np.fromiter((i + 1 for i, _ in keep), dtype=np.int64, count=len(keep)))
    tokens = [s for _, s in keep]
    if not tokens:
        raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} holds no lengths (expected one integer a line)"])
    try:
        values = np.array(tokens).astype(np.int64)
    except (ValueError, OverflowError):
        for j, s in enumerate(tokens):
            try:
                int(s)
            except ValueError:
                raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(j)} is {s!r}: expected a positive integer "
                                          "(a token count)"]) from None
        raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} holds a length beyond 64-bit integers"]) from None
    return _checked(values, where), where


def _read_table(path: Path, column: str | None, kind: str) -> tuple[np.ndarray, _Where]:
    import polars as pl      # ~0.2 s to import: only where a table is read

    try:
        df = pl.read_csv(path, infer_schema_length=None) if kind == "csv" else pl.read_parquet(path)
    except Exception as exc:    # polars raises its own families (ComputeError, NoDataError, OSError, ...)
        raise ConfigError(FIELD, [f"field '{FIELD}': cannot read {path} as {kind}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]) from None
    if column is None:
        if df.width != 1:
            raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} has columns {df.columns}: name one "
                                      f"({{file: {path.name}, column: <name>}})"])
        column = df.columns[0]
    if column not in df.columns:
        raise ConfigError(FIELD, [f"field '{FIELD}.column' = {column!r}: {path.name} has no such column (it has "
                                  f"{df.columns})"])
    where = _Where(f"{path.name} (column {column})", "row", first=1)
    s = df.get_column(column)
    if s.len() == 0:
        raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} has no rows"])
    nulls = s.is_null()
    if nulls.any():
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(int(nulls.arg_max()))} is empty: expected a "
                                  "positive integer"])
    if not (s.dtype.is_integer() or s.dtype.is_float()):
        first = s[0]
        raise ConfigError(FIELD, [f"field '{FIELD}': column {column!r} of {path.name} holds {s.dtype} values "
                                  f"(row 1: {first!r}): expected positive integers"])
    return _checked(_whole(s.to_numpy(), where), where), where


def _read_jsonl(path: Path, field: str | None) -> tuple[np.ndarray, _Where]:
    values: list = []
    lines: list[int] = []
    try:
        with path.open() as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(FIELD, [f"field '{FIELD}': line {n} of {path.name} is not JSON ({exc.msg})"]) \
                        from None
                if field is None:
                    if isinstance(obj, dict):
                        raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} holds objects: name the field "
                                                  f"({{file: {path.name}, field: <name>}}; line {n} has "
                                                  f"{sorted(obj)[:8]})"])
                    v = obj
                else:
                    if not isinstance(obj, dict) or field not in obj:
                        raise ConfigError(FIELD, [f"field '{FIELD}.field' = {field!r}: line {n} of {path.name} "
                                                  "has no such field"])
                    v = obj[field]
                values.append(v)
                lines.append(n)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(FIELD, [f"field '{FIELD}': cannot read {path}: {exc}"]) from None
    where = _Where(path.name + (f" (field {field})" if field else ""), "line", np.asarray(lines, dtype=np.int64))
    if not values:
        raise ConfigError(FIELD, [f"field '{FIELD}': {path.name} holds no lengths"])
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(j)} is {v!r}: expected a positive integer"])
    return _checked(_whole(np.asarray(values, dtype=np.float64 if any(isinstance(v, float) for v in values)
                                      else np.int64), where), where), where


def _histogram(h: Any) -> tuple[np.ndarray, _Where]:
    f = f"{FIELD}.histogram"
    if not isinstance(h, dict) or "counts" not in h or (("values" in h) == ("edges" in h)):
        raise ConfigError(FIELD, [f"field '{f}': expected {{values: [...], counts: [...]}} or "
                                  "{edges: [...], counts: [...]} (docs/packing.md)"])
    extra = set(h) - {"values", "edges", "counts"}
    if extra:
        raise ConfigError(FIELD, [f"field '{f}': unknown key(s) {sorted(extra)} (expected values or edges, and "
                                  "counts)"])
    counts = _int_list(h["counts"], f"{f}.counts", minimum=0)
    total = sum(counts)
    if total == 0:
        raise ConfigError(FIELD, [f"field '{f}.counts': every count is 0: no sequences"])
    if total > MAX_SEQUENCES:
        raise ConfigError(FIELD, [f"field '{f}.counts': {total} sequences in all, more than the {MAX_SEQUENCES} "
                                  "tptune expands; scale the counts down (only their proportions matter)"])
    if "values" in h:
        values = _int_list(h["values"], f"{f}.values", minimum=1)
        if len(values) != len(counts):
            raise ConfigError(FIELD, [f"field '{f}': {len(values)} values and {len(counts)} counts: expected one "
                                      "count per value"])
        out = np.repeat(np.asarray(values, dtype=np.int64), counts)
    else:
        edges = _int_list(h["edges"], f"{f}.edges", minimum=1)
        if len(edges) != len(counts) + 1:
            raise ConfigError(FIELD, [f"field '{f}': {len(edges)} edges and {len(counts)} counts: expected "
                                      "len(edges) == len(counts) + 1 (bins [edges[i], edges[i+1]))"])
        bad = [i for i in range(len(counts)) if edges[i + 1] <= edges[i]]
        if bad:
            raise ConfigError(FIELD, [f"field '{f}.edges': not increasing at {bad[0]} ({edges[bad[0]]} then "
                                      f"{edges[bad[0] + 1]})"])
        parts = []
        for lo, hi, c in zip(edges[:-1], edges[1:], counts):
            if c:
                j = np.arange(c, dtype=np.float64)
                parts.append(lo + np.floor((j + 0.5) * (hi - lo) / c).astype(np.int64))
        out = np.concatenate(parts)
    return out, _Where("the histogram", "sequence", first=1)


def _int_list(v: Any, f: str, minimum: int) -> list[int]:
    if not isinstance(v, list) or not v:
        raise ConfigError(FIELD, [f"field '{f}' = {v!r}: expected a non-empty list of integers"])
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
            raise ConfigError(FIELD, [f"field '{f}.{i}' = {x!r}: expected an integer >= {minimum}"])
    return v


# --- checks ----------------------------------------------------------------------------------------------

def _whole(a: np.ndarray, where: _Where) -> np.ndarray:
    """Integers from a numeric column: a float must be a whole number (1024.0), else refused naming it."""
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    bad = ~np.isfinite(a) | (a != np.floor(a))
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(i)} is {a[i].item()!r}: expected a positive integer "
                                  "(a token count)"])
    if a.size and np.abs(a).max() >= 2 ** 62:
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.source} holds a length beyond 64-bit integers"])
    return a.astype(np.int64)


def _checked(values: np.ndarray, where: _Where) -> np.ndarray:
    if values.size == 0:
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.source} holds no lengths"])
    bad = values <= 0
    if bad.any():
        i = int(np.argmax(bad))
        n = int(bad.sum())
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(i)} is {int(values[i])}: a sequence length must be "
                                  f"a positive integer ({n} of {values.size} are not)"])
    return values


def _check_longest(lengths: np.ndarray, where: _Where, packing: dict) -> None:
    i = int(np.argmax(lengths))
    longest = int(lengths[i])
    caps = packing.get("capacities")
    budget = packing.get("max_token_len")
    if isinstance(caps, list) and caps and all(isinstance(c, int) and not isinstance(c, bool) for c in caps):
        top = max(caps)
        if longest > top:
            raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(i)} is {longest} tokens, longer than every "
                                      f"capacity of workload.packing.capacities (the largest is {top}): no bin "
                                      "can hold it; list a capacity of at least that, or drop the sequence"])
    elif isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 and longest > 2 * budget:
        raise ConfigError(FIELD, [f"field '{FIELD}': {where.at(i)} is {longest} tokens, longer than every candidate "
                                  f"capacity (they reach twice workload.packing.max_token_len = {2 * budget}): raise "
                                  "max_token_len, list workload.packing.capacities, or drop the sequence"])


def summary(lengths: np.ndarray) -> dict:
    """Count, mean, median, p90, p99 and max of the lengths (for the report and the docs)."""
    q = np.percentile(lengths, [50, 90, 99])
    return {"count": int(lengths.size), "mean": round(float(lengths.mean()), 1), "p50": int(q[0]),
            "p90": int(q[1]), "p99": int(q[2]), "max": int(lengths.max()),
            "tokens": int(lengths.sum()), "log2_spread": round(math.log2(lengths.max() / max(1, lengths.min())), 2)}

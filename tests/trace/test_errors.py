"""Broken inputs raise a one-line TraceError naming the file; the CLI exits 2."""

import gzip
from pathlib import Path

import pytest

from tptune.errors import TraceError
from tptune.trace import load_trace
from tptune.trace.cli import analyze_cli

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
REAL = TRACES / "te_qkv_ub.rank0.pt.trace.json.gz"


def _check(path: Path, match: str):
    with pytest.raises(TraceError, match=match) as err:
        load_trace(path)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg


def test_truncated_gz(tmp_path):
    data = REAL.read_bytes()
    p = tmp_path / "cut.rank0.json.gz"
    p.write_bytes(data[: len(data) // 2])
    _check(p, "truncated or corrupt gzip")


def test_truncated_json(tmp_path):
    text = gzip.decompress(REAL.read_bytes())
    p = tmp_path / "cut.json"
    p.write_bytes(text[: len(text) * 2 // 3])
    _check(p, "truncated|corrupt")


def test_corrupt_json_inside_events(tmp_path):
    text = gzip.decompress(REAL.read_bytes()).replace(b'"ph": "X"', b'"ph": X', 1)
    p = tmp_path / "bad.json"
    p.write_bytes(text)
    _check(p, "corrupt JSON")


def test_not_json(tmp_path):
    p = tmp_path / "notes.json"
    p.write_text("hello, world")
    _check(p, "not JSON|not a Chrome trace")


def test_non_trace_json(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"a": 1}')
    _check(p, "not a Chrome trace")


@pytest.mark.parametrize("events", ["[]", '[{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]'])
def test_trace_without_events(tmp_path, events):
    p = tmp_path / "empty.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": ' + events + "}")
    _check(p, "no GPU kernels and no CPU ops")


def test_missing_file(tmp_path):
    _check(tmp_path / "nope.json", "no such file")


def test_cli_prints_error_and_returns_2(tmp_path, capsys):
    p = tmp_path / "a.json"
    p.write_text('{"a": 1}')
    assert analyze_cli([str(REAL), str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and err.count("\n") == 1

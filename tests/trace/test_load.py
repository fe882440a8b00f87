"""Loader: chunked decoding (in process and in worker processes) gives the same
frames as decoding in one piece; rank from distributedInfo or the file name."""

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import tptune.trace.load as load_mod
from tptune.trace import load_trace

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
REAL = TRACES / "te_proj_ub.rank0.pt.trace.json.gz"


def _frames(t):
    return [t.gpu, t.runtime, t.cpu]


def test_keeps_only_needed_fields_in_ns():
    t = load_trace(REAL)
    assert t.gpu.columns == list(load_mod.FRAME_SCHEMA)
    k = t.gpu.filter(pl.col("correlation") == 16587).to_dicts()[0]
    # kernel: "ts": 4455598655406.192, "dur": 632.832, stream 7
    assert (k["ts"], k["dur"], k["stream"]) == (4455598655406192, 632832, 7)
    assert t.rank == 0 and t.meta["distributedInfo"]["world_size"] == 2


@pytest.mark.parametrize("workers", ["1", "2"])
def test_small_chunks_give_same_frames(monkeypatch, workers):
    whole = load_trace(REAL)
    monkeypatch.setattr(load_mod, "_READ_BLOCK", 2048)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TPTUNE_TRACE_WORKERS", workers)
    chunked = load_trace(REAL)
    for a, b in zip(_frames(whole), _frames(chunked)):
        assert a.equals(b)


def test_compact_json_and_rank_from_file_name(tmp_path):
    doc = json.loads(gzip.decompress(REAL.read_bytes()))
    del doc["distributedInfo"]
    p = tmp_path / "trace.rank3.json"
    p.write_text(json.dumps(doc, separators=(",", ":")))  # no newlines: one chunk
    t = load_trace(p)
    assert t.rank == 3
    for a, b in zip(_frames(load_trace(REAL)), _frames(t)):
        assert a.equals(b)


def test_unknown_phase_falls_back_to_plain_decoder(tmp_path):
    text = gzip.decompress(REAL.read_bytes()).replace(b'"ph": "i"', b'"ph": "Z"')
    p = tmp_path / "odd.json"
    p.write_bytes(text)
    assert load_trace(p).gpu.height == load_trace(REAL).gpu.height

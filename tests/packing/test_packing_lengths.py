"""Reading the sequence lengths in every form, and the errors naming the file and line (tptune.packing.lengths)."""
import json

import numpy as np
import polars as pl
import pytest

from tptune.errors import ConfigError
from tptune.packing.lengths import load_lengths


def error(spec, base):
    with pytest.raises(ConfigError) as e:
        load_lengths(spec, base)
    return str(e.value)


def test_text_file_one_integer_a_line(tmp_path):
    (tmp_path / "l.txt").write_text("# synthetic\n512\n\n 1024 \n7\n")
    got = load_lengths({"lengths": "l.txt"}, tmp_path)
    assert got.dtype == np.int64 and got.tolist() == [512, 1024, 7]
    assert load_lengths("l.txt", tmp_path).tolist() == [512, 1024, 7]


@pytest.mark.parametrize("text,what", [("5\n12.5\n", "line 2 of l.txt is '12.5'"), ("5\n0\n", "line 2 of l.txt is 0"),
                                       ("3\n-4\n-1\n", "line 2 of l.txt is -4"), ("# none\n\n", "holds no lengths"),
                                       ("", "holds no lengths"), ("7\nabc\n", "line 2 of l.txt is 'abc'")])
def test_text_file_errors_name_the_line(tmp_path, text, what):
    (tmp_path / "l.txt").write_text(text)
    msg = error({"lengths": "l.txt"}, tmp_path)
    assert "workload.packing.lengths" in msg and what in msg


def test_csv_and_parquet_columns(tmp_path):
    pl.DataFrame({"prompt": [10, 20], "total": [100, 2000]}).write_csv(tmp_path / "r.csv")
    pl.DataFrame({"total": [3.0, 4.0]}).write_parquet(tmp_path / "r.parquet")
    assert load_lengths({"lengths": {"file": "r.csv", "column": "total"}}, tmp_path).tolist() == [100, 2000]
    assert load_lengths({"lengths": "r.parquet"}, tmp_path).tolist() == [3, 4]          # one column, whole floats
    assert "has columns ['prompt', 'total']: name one" in error({"lengths": "r.csv"}, tmp_path)
    assert "'nope': r.csv has no such column" in error({"lengths": {"file": "r.csv", "column": "nope"}}, tmp_path)
    pl.DataFrame({"total": [3.0, 4.5]}).write_parquet(tmp_path / "bad.parquet")
    assert "row 2 of bad.parquet (column total) is 4.5" in error({"lengths": "bad.parquet"}, tmp_path)
    (tmp_path / "gap.csv").write_text("total,x\n5,1\n,2\n")
    gap = error({"lengths": {"file": "gap.csv", "column": "total"}}, tmp_path)
    assert "row 2 of gap.csv (column total) is empty" in gap


def test_jsonl_field(tmp_path):
    rows = [{"total_length": 300, "reward": 1}, {"total_length": 40, "reward": 0}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = {"lengths": {"file": "r.jsonl", "field": "total_length"}}
    assert load_lengths(spec, tmp_path).tolist() == [300, 40]
    assert "name the field" in error({"lengths": "r.jsonl"}, tmp_path)
    assert "line 1 of r.jsonl has no such field" in error({"lengths": {"file": "r.jsonl", "field": "n"}}, tmp_path)
    (tmp_path / "s.jsonl").write_text('{"n": 5}\n{"n": "x"}\n')
    assert "line 2 of s.jsonl (field n) is 'x'" in error({"lengths": {"file": "s.jsonl", "field": "n"}}, tmp_path)


def test_histograms(tmp_path):
    h = {"lengths": {"histogram": {"values": [512, 4096], "counts": [3, 1]}}}
    assert load_lengths(h, tmp_path).tolist() == [512, 512, 512, 4096]
    # bins [100, 200) x 4 and [200, 1000) x 2: spread evenly, floor((j + 0.5) * width / c) above the edge
    e = {"lengths": {"histogram": {"edges": [100, 200, 1000], "counts": [4, 2]}}}
    assert load_lengths(e, tmp_path).tolist() == [112, 137, 162, 187, 400, 800]
    assert "one count per value" in error({"lengths": {"histogram": {"values": [1, 2], "counts": [1]}}}, tmp_path)
    assert "len(edges) == len(counts) + 1" in error({"lengths": {"histogram": {"edges": [1, 2], "counts": [1, 1]}}},
                                                    tmp_path)
    assert "not increasing" in error({"lengths": {"histogram": {"edges": [5, 5, 9], "counts": [1, 1]}}}, tmp_path)
    assert "histogram.values.1' = 0" in error({"lengths": {"histogram": {"values": [3, 0], "counts": [1, 1]}}},
                                              tmp_path)
    assert "every count is 0" in error({"lengths": {"histogram": {"values": [3], "counts": [0]}}}, tmp_path)


def test_a_sequence_longer_than_every_capacity(tmp_path):
    (tmp_path / "l.txt").write_text("100\n9000\n")
    msg = error({"lengths": "l.txt", "capacities": [4096, 8192]}, tmp_path)
    assert "line 2 of l.txt is 9000 tokens, longer than every capacity" in msg and "largest is 8192" in msg
    msg = error({"lengths": "l.txt", "max_token_len": 4000}, tmp_path)
    assert "longer than every candidate capacity" in msg and "8000" in msg
    assert load_lengths({"lengths": "l.txt", "max_token_len": 4500}, tmp_path).max() == 9000


def test_bad_specs(tmp_path):
    assert "not found" in error({"lengths": "missing.txt"}, tmp_path)
    (tmp_path / "x.xlsx").write_text("1")
    assert "unknown file type '.xlsx'" in error({"lengths": "x.xlsx"}, tmp_path)
    assert "expected a file path" in error({"lengths": 42}, tmp_path)
    assert "give column (CSV/Parquet) or field" in error({"lengths": {"file": "a.csv", "column": "a", "field": "b"}},
                                                         tmp_path)

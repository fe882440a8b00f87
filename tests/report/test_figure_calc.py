"""The calc figure kind (report.figure_calc) on committed records: a difference of wall times, the median of
per-call ratios of two recorded lists, aggregates over a mapping's values and over a JSON-lines file; what is not
arithmetic over the values is refused."""
import json
import statistics

import pytest

from tptune.report.figure_calc import calc, evaluate
from tptune.report.quoted_figures import Figures

from conftest import ROOT

RESULTS = ROOT / "results"


def test_a_difference_of_recorded_wall_times_and_a_confirm_stage_share():
    run = "confirm-mistral-small-24b-h200x4"
    d = {"expr": "wall - stage", "values": {"wall": {"file": f"{run}/wall_s.txt"},
                                             "stage": {"file": f"{run}/confirm.json", "key": "wall_s"}}}
    wall = float((RESULTS / run / "wall_s.txt").read_text())
    stage = json.loads((RESULTS / run / "confirm.json").read_text())["wall_s"]
    assert calc(RESULTS, d) == pytest.approx(wall - stage)
    figs = Figures(RESULTS, spec={"figures": {"x": {"kind": "calc", **d, "format": "{value:.0f} s"}}})
    assert figs.get("x") == f"{wall - stage:.0f} s"


def test_element_wise_ratios_of_two_recorded_lists_and_their_median():
    rec = json.loads((RESULTS / "tp24-llama3-70b-h200x4/rep1/confirm.json").read_text())
    by = {s: [x["median_ms"] for x in sorted(rec["launches"], key=lambda x: x["round"]) if x["setting"] == s]
          for s in ("set", "none")}
    d = {"expr": "median(a / b)", "values": {
        "a": {"file": "tp24-llama3-70b-h200x4/rep1/confirm.json", "key": "launches", "where": {"setting": "set"},
              "field": "median_ms"},
        "b": {"file": "tp24-llama3-70b-h200x4/rep1/confirm.json", "key": "launches", "where": {"setting": "none"},
              "field": "median_ms"}}}
    # launches are recorded round by round, so the filtered lists pair by round
    assert calc(RESULTS, d) == pytest.approx(statistics.median([a / b for a, b in zip(by["set"], by["none"])]))


def test_a_mapping_and_a_json_lines_file_aggregate(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "x.json").write_text(json.dumps({"sd": {"qkv": 0.03, "proj": 0.04}}))
    (tmp_path / "r" / "y.jsonl").write_text('{"ms": 2.0}\n{"ms": 4.0}\n\n{"ms": 9.0}\n')
    assert calc(tmp_path / "r", {"expr": "rms(a)", "values": {"a": {"file": "x.json", "key": "sd"}}}) == \
        pytest.approx((0.5 * (0.03 ** 2 + 0.04 ** 2)) ** 0.5)
    assert calc(tmp_path / "r", {"expr": "max(a) / min(a) - 1", "values": {
        "a": {"file": "y.jsonl", "lines": True, "field": "ms"}}}) == pytest.approx(3.5)


@pytest.mark.parametrize("expr, why", [("__import__('os')", "not arithmetic"), ("a.real", "not arithmetic"),
                                       ("b + 1", "none of values"), ("a +", "expr")])
def test_what_is_not_arithmetic_over_the_values_is_refused(expr, why):
    with pytest.raises(ValueError, match=why):
        evaluate(expr, {"a": 1.0})


def test_a_missing_key_names_the_value_and_the_file():
    d = {"expr": "a", "values": {"a": {"file": "confirm-mistral-small-24b-h200x4/confirm.json", "key": "ratios.nope"}}}
    with pytest.raises(ValueError, match=r"values.a \(confirm-mistral-small-24b-h200x4/confirm.json\): no 'nope'"):
        calc(RESULTS, d)


def test_csv_glob_listed_keys_t_quantiles_and_counts(tmp_path):
    """A measurements.csv's rows, every file of a glob, a key holding a dot, Student's t as the package's, and a
    count of values below a threshold."""
    from tptune.stats.rounds import t975

    r = tmp_path / "r"
    (r / "cases" / "a").mkdir(parents=True)
    (r / "cases" / "b").mkdir(parents=True)
    (r / "m.csv").write_text("op,tp,median_ms\nqkv,2,1.5\nqkv,4,0.9\nfc1,2,7.0\n")
    (r / "cases" / "a" / "run.json").write_text(json.dumps({"wall_s": 2.0}))
    (r / "cases" / "b" / "run.json").write_text(json.dumps({"wall_s": 3.5}))
    (r / "d.json").write_text(json.dumps({"searches": {"tp2/wgrad.bulk": [0.97, 1.01, 0.99]}}))
    assert calc(r, {"expr": "sum(a)", "values": {"a": {"file": "m.csv", "csv": True, "where": {"op": "qkv"},
                                                        "field": "median_ms"}}}) == pytest.approx(2.4)
    assert calc(r, {"expr": "sum(a)", "values": {"a": {"glob": "cases/*/run.json", "key": "wall_s"}}}) == 5.5
    v = {"a": {"file": "d.json", "key": ["searches", "tp2/wgrad.bulk"]}}
    assert calc(r, {"expr": "sum(lt(a, 1))", "values": v}) == 2
    assert calc(r, {"expr": "t975(4) * 2", "values": {}}) == pytest.approx(2 * t975(4))
    assert calc(r, {"expr": "len(concat(a, a, 1))", "values": v}) == 7
    assert calc(r, {"expr": "exp(mean(log(a)))", "values": v}) == pytest.approx((0.97 * 1.01 * 0.99) ** (1 / 3))
    with pytest.raises(ValueError, match="no file matches"):
        calc(r, {"expr": "a", "values": {"a": {"glob": "nothing/*.json"}}})


def test_a_number_a_benchmark_only_printed_is_read_by_a_regular_expression():
    log = (RESULTS / "lead-in-h100/lead-in-h100.txt").read_text().splitlines()[0]
    wall = float(log.rsplit("(", 1)[1].split()[0])
    d = {"expr": "a", "values": {"a": {"file": "lead-in-h100/lead-in-h100.txt", "match": r"\((\d+) s\)"}}}
    assert calc(RESULTS, d) == wall
    # a printed table's cell: the row's fourth column, not the first number of the file
    row = next(x for x in (RESULTS / "window-calibration-h100/noise-w500.txt").read_text().splitlines()
               if x.split()[:2] == ["proj", "gpu"])
    d = {"expr": "a", "values": {"a": {"file": "window-calibration-h100/noise-w500.txt",
                                       "match": r"^proj +gpu +\S+ +([\d.]+)%"}}}
    assert calc(RESULTS, d) == float(row.split()[3].rstrip("%"))
    d["values"]["a"]["match"] = r"^nope +(\d+)"
    with pytest.raises(ValueError, match="matches no line"):
        calc(RESULTS, d)


def test_count_reads_how_many_items_a_recorded_list_holds():
    glob = "stability-llama3-70b-x2/rep1/sessions/*/tp2/point/session.json"
    sessions = [json.loads(p.read_text()) for p in sorted(RESULTS.glob(glob))]
    d = {"expr": "n", "values": {"n": {"glob": glob, "key": "members", "count": True}}}
    assert calc(RESULTS, d) == [float(len(s["members"])) for s in sessions]
    # with field: each record's field counted (the launches of each setting of a confirm stage)
    rec = json.loads((RESULTS / "tp24-llama3-70b-h200x4/rep1/confirm.json").read_text())
    d = {"expr": "n", "values": {"n": {"file": "tp24-llama3-70b-h200x4/rep1/confirm.json", "key": "launches",
                                       "field": "iterations", "count": True}}}
    assert calc(RESULTS, d) == [float(len(x["iterations"])) for x in rec["launches"]]


def test_per_round_parts_and_group_peaks_of_a_runs_samples():
    f = "knobs-llama3-70b-x2/sessions/fc1/tp2/point/none/run.json"
    t = json.loads((RESULTS / f).read_text())["timing"]["total_ms"]
    n = len(t["samples"]) // len(t["rounds"])
    rounds = [t["samples"][i:i + n] for i in range(0, len(t["samples"]), n)]
    values = {"s": {"file": f, "key": "timing.total_ms.samples"}, "r": {"file": f, "key": "timing.total_ms.rounds"}}
    first = calc(RESULTS, {"expr": "part(s, len(s) / len(r), 0, 5)", "values": values})
    assert first == [x for r in rounds for x in r[:5]]
    peaks = calc(RESULTS, {"expr": "group_max(part(s, len(s) / len(r), 5, 10), 5)", "values": values})
    assert peaks == [max(r[5:]) for r in rounds]
    with pytest.raises(ValueError, match="groups of 7.0: expected a list whose length"):
        calc(RESULTS, {"expr": "group_max(s, 7)", "values": values})

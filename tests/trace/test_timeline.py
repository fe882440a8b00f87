"""Timeline PNG and the analyze CLI end to end on real traces."""

import json
from pathlib import Path

from tptune.trace import plot_timeline
from tptune.trace.cli import analyze_cli

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
PNG = b"\x89PNG\r\n\x1a\n"


def test_timeline_png_whole_trace_and_one_step(tmp_path):
    out = plot_timeline(TRACES / "te_proj_ub.rank0.pt.trace.json.gz", tmp_path / "t.png")
    assert out.read_bytes()[:8] == PNG
    one = plot_timeline(TRACES / "te_qkv_base.rank0.pt.trace.json.gz", tmp_path / "s.png", step=3)
    assert one.read_bytes()[:8] == PNG


def test_cli_json_table_and_plot(tmp_path, capsys):
    paths = [str(p) for p in sorted(TRACES.glob("te_qkv_*.json.gz"))]
    assert analyze_cli([*paths, "--json", "--plot", str(tmp_path / "p.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"metrics", "summary"} <= doc.keys()
    assert {r["phase"] for r in doc["metrics"]} == {"forward", "backward"}
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG
    assert analyze_cli(paths[:1]) == 0
    table = capsys.readouterr().out
    assert "overlap_ms" in table and "summary" in table


def test_cli_patterns_file(tmp_path, capsys):
    pat = tmp_path / "p.yaml"
    pat.write_text('comm: "^ncclDevKernel_"\n')  # userbuffers no longer comm
    trace = str(TRACES / "te_qkv_ub.rank0.pt.trace.json.gz")
    assert analyze_cli([trace, "--json", "--patterns", str(pat)]) == 0
    rows = json.loads(capsys.readouterr().out)["metrics"]
    assert all(r["comm_ms"] == 0 for r in rows)
    pat.write_text("- not a mapping\n")
    assert analyze_cli([trace, "--patterns", str(pat)]) == 2

"""tptune figures: every figure the READMEs and docs quote is generated from the committed results
(report.quoted_figures, results/figures.yaml); the pairs it pools (records.block_sessions) and the block's
bound without its burn-in round, on the committed sessions."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tptune.errors import TptuneError
from tptune.records.block_sessions import index, same_pair
from tptune.records.point_fields import point_median
from tptune.report.quoted_figures import Figures, generate
from tptune.stats.bound import burned_in

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "results"
REP4_TP4 = "tp24-llama3-70b-h200x4/rep4/sessions/layer/tp4"


def test_every_quoted_figure_in_the_committed_tree_is_the_results():
    diffs = generate(ROOT, check=True)
    assert not diffs, "\n".join(map(str, diffs)) + "\n(run `tptune figures` to regenerate them)"


def _copy_block_files(root: Path) -> dict[str, str]:
    """Each file results/figures.yaml places a block in, copied under ``root``: {block: file}."""
    figs = Figures(RESULTS)
    placed = {name: figs.block_file(name) for name in figs.blocks}
    for rel in set(placed.values()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((ROOT / rel).read_text())
    return placed


def test_an_edited_copy_fails_the_check_naming_it(tmp_path):
    placed = _copy_block_files(tmp_path)
    assert placed == {"headline": "README.md", "proven": "results/README.md"}
    readme, table = tmp_path / "README.md", tmp_path / "results" / "README.md"
    assert "**0.977 [0.975, 0.979]" in readme.read_text() and "**1.072×**" in table.read_text()
    readme.write_text(readme.read_text().replace("**0.977 [0.975, 0.979]", "**0.977 [0.974, 0.979]"))
    table.write_text(table.read_text().replace("**1.072×**", "**1.078×**"))
    doc = tmp_path / "docs"
    doc.mkdir()
    (doc / "x.md").write_text("pooled <!-- figure:knobs_x2.nvidia -->0.977 [0.974, 0.980], 22 rounds<!-- /figure -->\n")
    diffs = generate(tmp_path, check=True, results=RESULTS)
    named = {(d.file, d.figure) for d in diffs}
    assert named == {("README.md", "figures:headline"), ("results/README.md", "figures:proven"),
                     ("docs/x.md", "knobs_x2.nvidia")}
    proven = next(d for d in diffs if d.file == "results/README.md")
    assert "1.078×" in str(proven) and "1.072×" in str(proven)
    # without --check the copies are rewritten, and then they pass
    generate(tmp_path, results=RESULTS)
    assert generate(tmp_path, check=True, results=RESULTS) == []
    assert "**1.072×**" in table.read_text() and "**0.977 [0.975, 0.979]" in readme.read_text()


def test_the_cli_check_names_the_copy_that_differs(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "results").symlink_to(RESULTS, target_is_directory=True)
    (root / "README.md").write_text("<!-- figure:rep4.limit_nemo -->1.078×<!-- /figure -->\n")
    r = subprocess.run([sys.executable, "-m", "tptune", "figures", "--check", "--root", str(root)],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "README.md: rep4.limit_nemo: reads '1.078×', the results give '1.072×'" in r.stderr


def test_a_block_missing_from_its_file_fails_the_check_and_is_not_put_back(tmp_path):
    placed = _copy_block_files(tmp_path)
    assert placed and generate(tmp_path, check=True, results=RESULTS) == []
    name, rel = sorted(placed.items())[0]
    f = tmp_path / rel
    text = f.read_text()
    start, end = text.index(f"<!-- figures:{name} -->\n"), text.index(f"<!-- /figures:{name} -->")
    f.write_text(text[:start] + text[end + len(f"<!-- /figures:{name} -->"):])   # the block and its markers gone
    diffs = generate(tmp_path, check=True, results=RESULTS)
    assert [(d.file, d.figure, d.missing) for d in diffs] == [(rel, f"figures:{name}", True)]
    assert "no <!-- figures:" in str(diffs[0]) and "figures.yaml places the block in this file" in str(diffs[0])
    # tptune figures cannot put it back (where it goes is the author's choice): it says so and exits 1
    before = f.read_text()
    r = subprocess.run([sys.executable, "-m", "tptune", "figures", "--root", str(tmp_path), "--results", str(RESULTS)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"missing: {rel}: figures:{name}" in r.stderr, r.stderr
    assert f.read_text() == before


def test_a_block_without_its_file_is_refused_naming_the_field():
    figs = Figures(RESULTS, spec={"figures": {}, "blocks": {"proven": "| a | b |\n"}})
    with pytest.raises(TptuneError, match=r"block proven: expected a mapping with file:"):
        figs.render_block("proven")


def test_pooling_finds_every_session_of_the_same_pair():
    sessions = index(RESULTS)
    # rep3 measured the combination rep4 wrote (the same settings, entry for entry)
    pairs = same_pair(sessions, REP4_TP4, "layer-tp4-ub.fastest_tp4", "layer-tp4-ub.nemo_tp4")
    assert [s.rel for s, _, _ in pairs] == [REP4_TP4, "tp24-llama3-70b-h200x4/rep3/sessions/layer/tp4"]
    # tptune verify's copy (true/false) of the stability run's file (0/1) is that file
    pairs = same_pair(sessions, "verify-llama3-70b-x2/sessions/layer/tp2", "layer-tp2-ub.user1", "layer-tp2-ub.nvidia_bf16_tp2")
    assert len(pairs) == 3
    # the same file on another node kind (4x H200's TP 2 block, 2x H100) is another pair
    knobs = same_pair(sessions, "knobs-llama3-70b-x2/sessions/layer/tp2", "layer-tp2-ub.tuned_tp2", "layer-tp2-ub.nvidia_bf16_tp2")
    assert len(knobs) == 7 and not any(s.rel.startswith(("tp24", "defaults", "knobs-llama3-70b-h100")) for s, _, _ in knobs)


def test_every_run_that_pools_its_block_names_every_session_of_its_pair():
    """The report's pooled block figures (pooled_with.json) and the generator's pool the same sessions."""
    sessions = index(RESULTS)
    named = set()
    for pw in RESULTS.rglob("pooled_with.json"):
        group = {(pw.parent / o["session"]).resolve() for o in json.loads(pw.read_text())}
        named |= {frozenset(group | {x}) for x in (pw.parent / "sessions" / "layer").glob("tp*")
                  if any(g.name == x.name for g in group)}
    for s in sessions:
        tuned = [c for c in s.identity if c.endswith(("ub.tuned_tp2", "ub.tuned_tp4"))]
        if not tuned or not any(c.endswith("-none") for c in s.identity):
            continue
        none = next(c for c in s.identity if c.endswith("-none"))
        pairs = same_pair(sessions, s.rel, tuned[0], none)
        if len(pairs) > 1:
            group = frozenset((RESULTS / p.rel).resolve() for p, _, _ in pairs)
            assert any(group <= g for g in named), f"{s.rel}: no pooled_with.json names {sorted(map(str, group))}"


def test_the_block_limit_leaves_the_bounds_burn_in_round_out():
    figs = Figures(RESULTS)
    bs = next(s for s in figs.sessions if s.rel == REP4_TP4)
    bound, nemo = bs.session.points["layer-tp4-nocomm"], bs.session.points["layer-tp4-ub.nemo_tp4"]
    with_burn_in = point_median(nemo) / point_median(bound)
    assert f"{with_burn_in:.3f}" == "1.078"       # what the docs quoted before
    assert figs.get("rep4.limit_nemo") == f"{point_median(nemo) / point_median(burned_in(bound)):.3f}×" == "1.072×"
    # the re-derived report says the same
    assert "`ub.nemo_tp4` 1.072×" in (RESULTS / "tp24-llama3-70b-h200x4/rep4/report.md").read_text()


@pytest.mark.parametrize("name,expected", [("knobs_x2.nvidia", "0.977 [0.975, 0.979], 36 rounds pooled over 7 sessions"),
                                           ("rep4.tuned_file", "1.009 [1.005, 1.013], 6 rounds pooled over 2 sessions")])
def test_pooled_figures_with_host_ahead_rounds_carry_no_note(name, expected):
    assert Figures(RESULTS).get(name) == expected


def test_a_pooled_figure_with_host_behind_rounds_says_so():
    got = Figures(RESULTS).get("fp8_tp4.nvidia")
    assert got.endswith("; includes host-behind rounds (9 of 15 batches)")


def test_the_kinds_a_run_readme_quotes_read_the_committed_records():
    spec = {"figures": {
        "first3": {"kind": "pooled", "session": "tp24-llama3-70b-h200x4/rep1/sessions/layer/tp4", "a": "ub.tuned_tp4",
                   "b": "ub.nemo_tp4_recipe", "only": [f"tp24-llama3-70b-h200x4/rep{i}/sessions/layer/tp4" for i in (1, 2, 3)]},
        "all": {"kind": "pooled", "session": "tp24-llama3-70b-h200x4/rep1/sessions/layer/tp4", "a": "ub.tuned_tp4",
                "b": "ub.nemo_tp4_recipe"},
        "bound": {"kind": "median", "session": REP4_TP4, "a": "nocomm"},
        "bound_first": {"kind": "median", "session": REP4_TP4, "a": "nocomm", "burn_in": "keep"},
        "limit_first": {"kind": "limit", "session": REP4_TP4, "a": "ub.nemo_tp4", "burn_in": "keep"},
        "rule": {"kind": "value", "file": "tp24-llama3-70b-h200x4/rep1/decisions.json",
                 "key": "meta.model_tp_evidence.1", "format": "{value[time_to_ms]:.3f} ≤ {value[bound_ms]:.3f}"},
        "account": {"kind": "account", "session": REP4_TP4, "format": "{bound_ms:.3f} {left_ms:.3f} {ref[ub.nemo_tp4][limit]:.3f}"},
        "op_point": {"kind": "op", "session": "knobs-llama3-70b-x2/sessions/qkv/tp2/point", "a": "chosen",
                     "b": "ub.nvidia_bf16_tp2"},
        "op_verify": {"kind": "op", "session": "rs-dgrad-x2/emitted/sessions/qkv/tp2", "a": "ub.user1", "b": "ub.user2",
                      "format": "{ratio} [{lo}, {hi}]"},
        "no_such": {"kind": "pooled", "session": REP4_TP4, "a": "ub.tuned_tp4", "b": "ub.nemo_tp4",
                    "only": ["tp24-llama3-70b-h200x4/rep2/sessions/layer/tp2"]},
    }}
    figs = Figures(RESULTS, spec=spec)
    assert figs.get("first3") == "0.978 [0.974, 0.982], 9 rounds pooled over 3 sessions"
    assert figs.get("all").endswith("11 rounds pooled over 4 sessions")
    assert (figs.get("bound"), figs.get("bound_first"), figs.get("limit_first")) == ("38.926 ms", "38.704 ms", "1.078×")
    assert figs.get("rule") == "16.709 ≤ 18.154"
    # the account is the report's: its bound without the burn-in round, the limit the table quotes
    assert figs.get("account") == "38.926 1.500 1.072"
    assert "40.427) hides **61% [9, 100]** of that\nexposed time on the block; 1.500 ms stay above the bound" in (RESULTS / "tp24-llama3-70b-h200x4/rep4/report.md").read_text()
    # an op's pick (decisions.json) against a preset in its TP point; a tptune verify op session
    assert figs.get("op_point") == "0.976 [0.955, 0.997], 6 rounds"
    assert figs.get("op_verify") == "0.973 [0.967, 0.979]"
    with pytest.raises(TptuneError, match=r"figure no_such: only: .*measured no"):
        figs.get("no_such")


def test_a_run_folders_own_figures_yaml_is_merged_and_a_name_defined_twice_refused(tmp_path):
    """results/<run>/figures.yaml holds the figures only that run's README quotes; they are computed like the
    top file's, and a name both define is an error naming both files."""
    import shutil

    from tptune.report.quoted_figures import load_spec

    results = tmp_path / "results"
    run = results / "defaults-mistral-small-24b-h100x4"
    run.mkdir(parents=True)
    shutil.copy(RESULTS / "defaults-mistral-small-24b-h100x4" / "wall_s.txt", run / "wall_s.txt")
    (results / "figures.yaml").write_text("figures:\n  a.wall: {kind: value, file: defaults-mistral-small-24b-h100x4/"
                                          "wall_s.txt, format: '{value:.0f} s'}\n")
    (run / "figures.yaml").write_text("figures:\n  b.wall: {kind: value, file: defaults-mistral-small-24b-h100x4/"
                                      "wall_s.txt, format: '{value:.1f} s'}\n")
    figs = Figures(results)
    wall = float((run / "wall_s.txt").read_text())
    assert figs.get("a.wall") == f"{wall:.0f} s" and figs.get("b.wall") == f"{wall:.1f} s"
    (run / "figures.yaml").write_text("figures:\n  a.wall: {kind: value, file: x, format: '{value}'}\n")
    with pytest.raises(TptuneError, match=r"figure 'a.wall' is defined in .*results/figures.yaml too"):
        load_spec(results)


UNCLOSED = ("intro\n"
            "first <!-- figure:rep4.limit_nemo -->1.072× and then the closing marker is gone\n"
            "text that must survive\n"
            "more text\n"
            "second <!-- figure:knobs_x2.nvidia -->0.977<!-- /figure -->\n")


@pytest.mark.parametrize("check", [False, True])
def test_an_unclosed_marker_is_refused_naming_it_and_nothing_is_written(tmp_path, check):
    """Issue 54 item 2: a figure marker whose <!-- /figure --> is gone made tptune figures rewrite everything up
    to the next figure's closing marker (that figure's marker with it) and return 0; --check reported a value."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "results").symlink_to(RESULTS, target_is_directory=True)
    (root / "README.md").write_text(UNCLOSED)
    other = root / "docs" / "x.md"   # a file with a figure to rewrite: nothing is written there either
    other.write_text("<!-- figure:rep4.limit_nemo -->1.078×<!-- /figure -->\n")
    r = subprocess.run([sys.executable, "-m", "tptune", "figures", "--root", str(root), *(["--check"] if check else [])],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "README.md:2: <!-- figure:rep4.limit_nemo --> is unclosed" in r.stderr, r.stderr
    assert "reads" not in r.stderr and "Traceback" not in r.stderr
    assert (root / "README.md").read_text() == UNCLOSED
    assert other.read_text() == "<!-- figure:rep4.limit_nemo -->1.078×<!-- /figure -->\n"


@pytest.mark.parametrize("text, says", [
    ("a <!-- /figure --> alone\n", "x.md:1: <!-- /figure --> closes no <!-- figure:NAME -->"),
    ("<!-- figures:proven -->\n| a |\n<!-- figure:rep4.limit_nemo -->1.072×<!-- /figure -->\n",
     "x.md:1: <!-- figures:proven --> is unclosed"),
    ("<!-- figures:proven -->\n| a |\n<!-- /figures:headline -->\n", "x.md:1: <!-- figures:proven --> is unclosed"),
])
def test_a_marker_out_of_place_is_refused_naming_its_line(tmp_path, text, says):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(text)
    with pytest.raises(TptuneError, match=re.escape(says)):
        generate(tmp_path, results=RESULTS)
    assert (tmp_path / "docs" / "x.md").read_text() == text

"""The report's confirm section (report/confirm_section.py, templates/confirm.md.j2) from a confirm.json the stage
wrote on a copy of a committed run, with the format-true stand-in trainer (tests/confirm/standin_trainer.py) as
Megatron; absent without confirm.json."""
import shutil

import jinja2

from conftest import ROOT
from tptune.confirm.stage import run_confirm
from tptune.records.run_dir import RunDir
from tptune.report.confirm_section import ANCHOR, confirm_section, with_confirm_section
from tptune.report.render import TEMPLATES

RUN = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"
STANDIN = ROOT / "tests" / "confirm" / "standin_trainer.py"


def test_the_section_says_the_ratio_rounds_loss_and_layers_share(tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures", "logs",
                                                            "*.parquet", "*.csv", "confirm", "confirm.json"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    assert confirm_section(env, RunDir(dst)) == ""
    run_confirm(dst, rounds=3, iters=12, launcher=f"{{python}} {STANDIN}", say=lambda *_: None)
    md = confirm_section(env, RunDir(dst))
    assert md.startswith("## In Megatron-LM's training loop (2 layers)")
    assert "the emitted set takes **0.985** of `nvidia_bf16_tp2`'s iteration time [" in md and "3 rounds" in md
    assert "loss as without overlap" in md and "of the set's iteration" in md
    text = with_confirm_section("# r\n\ncard" + ANCHOR + "\n...", md)
    assert text.index("## In Megatron-LM") < text.index(ANCHOR.strip())


def test_the_committed_one_round_confirm_says_not_judged():
    """rep1's confirm.json (one round on 4x H200): no interval, and the loss not judged (no repeat noise), with
    NVIDIA's preset's own difference beside the set's."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    md = confirm_section(env, RunDir(RUN))
    assert "[no interval: one round], 1 round (undecided)" in md
    assert "loss not judged: one round has no repeat noise" in md and "`nvidia_bf16_tp2`'s 0.0004" in md

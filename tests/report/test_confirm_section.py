"""The report's confirm section (report/confirm_section.py, templates/confirm.md.j2) from a confirm.json the stage
wrote on a copy of a committed run, with the format-true stand-in trainer (tests/confirm/standin_trainer.py) as
Megatron; absent without confirm.json."""
import shutil

import jinja2

from conftest import ROOT
from tptune.confirm.stage import run_confirm
from tptune.records.run_dir import RunDir
from tptune.report.confirm_section import confirm_section, with_confirm_section
from tptune.report.sections import ANCHOR
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
    ck = tmp_path / "megatron-lm"             # a Megatron-LM "checkout" whose pretrain_gpt.py is the stand-in
    (ck / "megatron" / "training").mkdir(parents=True)
    (ck / "pretrain_gpt.py").write_text(f"import runpy\nrunpy.run_path({str(STANDIN)!r}, run_name='__main__')\n")
    run_confirm(dst, rounds=3, max_rounds=3, iters=12, megatron_lm=str(ck), say=lambda *_: None, tp=2,
                launcher="{python} -m torch.distributed.run --nproc-per-node {nproc} --master-port {port} {entry}")
    md = confirm_section(env, RunDir(dst))
    assert md.startswith("## In Megatron-LM's training loop (2 layers)")
    assert "the emitted set takes **0.985** of `nvidia_bf16_tp2`'s iteration time [" in md and "3 rounds" in md
    assert "loss as without overlap" in md and "of the set's iteration" in md
    assert "Against `nemo_tp4`, run as its own arm: **0.985**" in md and "Projected to the model's 80 layers" in md
    assert "the mean of the training log's iteration times from iteration 5" in md
    text = with_confirm_section("# r\n\ncard" + ANCHOR + "\n...", md)
    assert text.index("## In Megatron-LM") < text.index(ANCHOR.strip())


def test_one_round_says_not_judged(tmp_path):
    """Round 0 of rep1's committed confirm (4x H200) alone: no interval, and the loss not judged (no repeat noise),
    with NVIDIA's preset's own difference beside the set's."""
    import json

    from tptune.confirm.stage import rederive_confirm

    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures", "logs",
                                                            "*.parquet", "*.csv"))
    rec = json.loads((dst / "confirm.json").read_text())
    rec["launches"] = [x for x in rec["launches"] if x["round"] == 0]
    rec["rounds_planned"] = 1
    (dst / "confirm.json").write_text(json.dumps(rec))
    rederive_confirm(RunDir(dst))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    md = confirm_section(env, RunDir(dst))
    assert "[no interval: one round], 1 round (undecided)" in md
    assert "loss not judged: one round has no repeat noise" in md and "`nvidia_bf16_tp2`'s 0.00" in md


def test_the_committed_confirms_headline_is_on_the_answer_card():
    """Both committed three-round confirms (4x H200): the answer card's line gives the set / preset ratio with its
    interval and rounds, the layers' share of the iteration and the loss verdict, as confirm.json has them."""
    import json

    for run in (RUN, ROOT / "results" / "confirm-mistral-small-24b-h200x4"):
        c = json.loads((run / "confirm.json").read_text())
        sp = c["ratios"]["set/preset"]
        card = (run / "report.md").read_text().split("\n## ")[1]
        assert card.startswith("Answer")
        line = next(x for x in card.splitlines() if x.startswith("**In Megatron-LM's training loop**"))
        assert line.startswith(f"**In Megatron-LM's training loop** ({c['layers']} layers, about "
                               f"{100 * c['layers_share']['share']:.0f}% of the iteration, the tuned ops "
                               f"{100 * c['ops_share']['share']:.0f}%): {sp['ratio']:.3f} of "
                               f"`{c['settings']['preset']['label']}`'s iteration time [{sp['lo']:.3f}, "
                               f"{sp['hi']:.3f}], {sp['rounds']} rounds ({sp['words']})"), line
        assert c["loss_ok"] is True and line.endswith("; loss as without overlap.")
        ops = c["ops_share"]      # the TP point's chosen setting of each op, fwd+bwd, one layer and micro-batch
        dec = json.loads((run / "decisions.json").read_text())
        per = {op: rec["points"][str(c["tp"])]["best"]["timing"]["total_ms"]["median"] for op, rec in dec["ops"].items()}
        assert ops["ops_ms"] == {op: round(v, 4) for op, v in per.items()}
        assert 0 < ops["share"] < c["layers_share"]["share"] < 1

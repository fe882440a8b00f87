"""The confirm stage on packed data (confirm.packed, confirm.train_data): the bins every arm trains, drawn from the
run config's rollout lengths and filled to T, never reused within a launch; the packed micro-batch as the training
entry feeds it (cu_seqlens, the loss mask, positions restarting per sequence, padding to T); the Megatron arguments
at seq T and micro-batch 1 through Megatron's own parser; and the refusals."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from tptune.confirm.command import entry_args, launch_env, merged, model_args
from tptune.confirm.packed import packed_plan, tokens_per_second
from tptune.confirm.settings import confirm_settings
from tptune.confirm.stage import model_config
from tptune.confirm.train_data import PackedSamples, ProgressionSamples
from tptune.confirm.available import ConfirmUnavailable
from tptune.errors import ConfigError
from tptune.records.run_dir import RunDir

RUN = ROOT / "results" / "knobs-llama3-70b-x2"
PACKING = {"lengths": "config/packing/rl-bimodal.txt", "rule": "verl", "max_token_len": 4096, "seqs_per_step": 32,
           "forward_passes": 2}
FETCHED = ROOT / ".cache" / "megatron-lm"
MEGATRON = os.environ.get("TPTUNE_MEGATRON_PATH") or (str(FETCHED) if (FETCHED / ".complete").is_file() else None)


def _run(tmp_path, packing=PACKING) -> RunDir:
    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures", "logs",
                                                            "*.parquet", "*.csv"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["_base_dir"] = str(ROOT)
    if packing is not None:
        cfg["workload"] = {**cfg.get("workload", {}), "packing": packing}
    (dst / "config.json").write_text(json.dumps(cfg))
    return RunDir(dst)


def test_every_micro_batch_is_its_own_bin_of_whole_sequences_filled_to_t(tmp_path):
    run = _run(tmp_path)
    mc, path, summary = packed_plan(run, model_config(run), capacity=4096, iters=10, micro_batches=4, tp=2)
    spec = json.loads(path.read_text())
    bins = spec["bins"]
    assert spec["capacity"] == 4096 and len(bins) == 40 and summary["bins"] == 40
    assert all(0 < sum(b) <= 4096 for b in bins) and sum(len(b) for b in bins) > 40
    assert summary["padding_share"] == pytest.approx(1 - sum(map(sum, bins)) / (4096 * 40), abs=1e-4)
    assert mc.workload.seq_length == 4096 and mc.workload.micro_batch_size == 1
    # the same bins for every launch of the stage: drawn again, identical
    assert json.loads(packed_plan(run, model_config(run), capacity=4096, iters=10, micro_batches=4, tp=2)[1]
                      .read_text())["bins"] == bins
    argv = merged(model_args(mc, layers=2, tp=2, iters=10, micro_batches=4, seed=1), []) + entry_args(seed=1,
                                                                                                    packed=path)
    at = lambda f: argv[argv.index(f) + 1]
    assert at("--seq-length") == "4096" and at("--micro-batch-size") == "1" and at("--global-batch-size") == "4"
    assert at("--tptune-packed") == str(path)
    launches = [{"setting": "set", "status": "ok", "iteration_ms": 500.0},
                {"setting": "none", "status": "ok", "iteration_ms": 520.0}]
    tps = tokens_per_second(summary, launches)
    assert tps["set"] / tps["none"] == pytest.approx(520 / 500, rel=1e-4)


def test_a_packed_micro_batch_marks_its_sequences_and_masks_the_padding():
    ds = PackedSamples([[5, 3], [4]], capacity=12, num_samples=4, vocab_size=50_000, seed=7)
    b = ds[0]
    assert b["tokens"].shape == (12,) and b["cu_seqlens"].tolist() == [0, 5, 8, 12] and int(b["max_seqlen"]) == 5
    assert b["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    assert b["loss_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0] and int(b["real_tokens"]) == 8
    assert torch.equal(b["labels"][:4], b["tokens"][1:5])          # next token within a sequence
    assert ds[1]["cu_seqlens"].tolist() == [0, 4, 12] and torch.equal(ds[2]["tokens"], b["tokens"])
    with pytest.raises(ValueError, match="exceed the capacity"):
        PackedSamples([[10, 5]], capacity=12, num_samples=1, vocab_size=100, seed=0)


def test_plain_samples_are_the_same_in_every_launch_and_learnable():
    a, b = ProgressionSamples(8, 64, 128_256, seed=3), ProgressionSamples(8, 64, 128_256, seed=3)
    assert all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(8))
    assert not torch.equal(a[0]["tokens"], a[1]["tokens"])
    assert int(max(a[i]["tokens"].max() for i in range(8))) < 1024           # the learnable ids
    d = torch.diff(torch.cat([a[0]["tokens"], a[0]["labels"][-1:]])) % 1024
    assert len(set(d.tolist())) == 1                                       # one step a sample


def test_the_packed_stage_refuses_what_it_cannot_run(tmp_path):
    run = _run(tmp_path, packing=None)
    with pytest.raises(ConfigError, match="workload.packing"):
        packed_plan(run, model_config(run), capacity=4096, iters=10, micro_batches=4, tp=2)
    run = _run(tmp_path / "b")
    with pytest.raises(ConfigError, match="multiple of TP 2"):
        packed_plan(run, model_config(run), capacity=4097, iters=10, micro_batches=4, tp=2)
    with pytest.raises(ConfirmUnavailable, match="decided none"):
        packed_plan(run, model_config(run), capacity=None, iters=10, micro_batches=4, tp=2)


@pytest.mark.skipif(not MEGATRON, reason="megatron-core 0.19.2 is not unpacked here: bash scripts/fetch_megatron_lm.sh")
def test_megatrons_parser_takes_the_packed_arms(tmp_path):
    run = _run(tmp_path)
    mc, path, _ = packed_plan(run, model_config(run), capacity=4096, iters=10, micro_batches=4, tp=2)
    base = model_args(mc, layers=2, tp=2, iters=10, micro_batches=4, seed=1234)
    argvs = [merged(base, s.flags) + entry_args(seed=1234, packed=path) for s in confirm_settings(run, 2)]
    listing = tmp_path / "argvs.json"
    listing.write_text(json.dumps(argvs))
    env = {**launch_env(dict(os.environ), tmp_path), "RANK": "0", "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join([MEGATRON, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("megatron_validate.py")), str(listing)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    parsed = [json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("PARSED ")]
    assert len(parsed) == len(argvs) and all(g["seq_length"] == 4096 and g["micro_batch_size"] == 1
                                             and g["tptune_packed"] == str(path) for g in parsed)

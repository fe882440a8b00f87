"""``tptune confirm outputs/<run>``: the arguments and what the command does with them."""
from __future__ import annotations

import argparse
import sys

from tptune.confirm.defaults import DEFAULTS
from tptune.errors import TptuneError
from tptune.records.run_dir import RunDir

HELP = ("confirm the run's answer in Megatron-LM's own training loop: the emitted set, the best NVIDIA preset "
        "and no overlap, alternating launches (GPUs; writes confirm.json)")


def interval(r: dict) -> str:
    """"0.991 [0.985, 0.997]"; one round has no interval: "0.991 [no interval: 1 round]"."""
    if r.get("lo") is None or r.get("hi") is None or r["rounds"] < 2:
        return f"{r['ratio']:.3f} [no interval: {r['rounds']} round]"
    return f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dir", help="the run folder, outputs/<run> (decisions.json, model.json, the emitted files)")
    p.add_argument("--rounds", type=int, default=DEFAULTS["rounds"], help="the fewest rounds of [set, preset, "
                   "nemo, none] in rotating order, one fresh launch each (default %(default)s)")
    p.add_argument("--max-rounds", type=int, default=DEFAULTS["max_rounds"], help="rounds are added one at a time "
                   "until the headline ratios resolve or the budget ends, at most this many (default %(default)s)")
    p.add_argument("--budget", type=float, default=DEFAULTS["budget_s"], help="seconds: no round starts that "
                   "would end after this (default %(default)s)")
    p.add_argument("--target", type=float, default=DEFAULTS["target_half_width"], help="the half-width at which "
                   "a headline ratio is resolved (default %(default)s)")
    p.add_argument("--packed", action="store_true", help="train packed THD micro-batches of the run's rollout "
                   "lengths (workload.packing), filled to --capacity (default: the capacity packing.json decided)")
    p.add_argument("--capacity", type=int, help="the packed micro-batches' capacity T (tokens)")
    p.add_argument("--megatron-lm", help="a Megatron-LM checkout whose pretrain_gpt.py runs each launch as it is "
                   "(default: tptune's own training entry on the installed megatron-core)")
    p.add_argument("--layers", type=int, help="transformer layers (default: as many as fit, at least 2, at most "
                   "--max-layers)")
    p.add_argument("--max-layers", type=int, default=DEFAULTS["max_layers"], help="(default %(default)s)")
    p.add_argument("--iters", type=int, default=DEFAULTS["iters"], help="training iterations a launch; the "
                   f"median counts iterations {DEFAULTS['timed_from']} on (default %(default)s)")
    p.add_argument("--micro-batches", type=int, default=DEFAULTS["micro_batches"],
                   help="micro-batches an iteration (global batch = this x the workload's; default %(default)s)")
    p.add_argument("--timeout", type=float, default=DEFAULTS["timeout_s"], help="seconds before a launch is "
                   "killed as hung (default %(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--tp", type=int, help="the TP whose emitted set to confirm (default: the model TP)")
    p.add_argument("--preset", help="the NVIDIA preset to compare with (default: the fastest the layer stage "
                   "ran under Megatron's default switches)")
    p.add_argument("--launcher", help="the command before Megatron's arguments, {nproc} {port} {entry} {python} "
                   "filled in (default: python -m torch.distributed.run on this node)")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when the set's loss differs or the stage "
                   "cannot run here (the workflow's rule: confirm.json and the report say it)")
    return p


def run(a: argparse.Namespace) -> int:
    from tptune.confirm.available import ConfirmUnavailable, not_run_record
    from tptune.confirm.stage import run_confirm
    from tptune.emit.records import write_record

    try:
        rec = run_confirm(a.run_dir, rounds=a.rounds, layers=a.layers, iters=a.iters, timeout_s=a.timeout,
                          micro_batches=a.micro_batches, max_layers=a.max_layers, seed=a.seed, preset=a.preset,
                          launcher=a.launcher, tp=a.tp, max_rounds=a.max_rounds, budget_s=a.budget,
                          target=a.target, megatron_lm=a.megatron_lm, packed=a.packed, capacity=a.capacity)
    except ConfirmUnavailable as exc:
        if not a.exit_zero:
            raise
        # the workflow's rule (the stage is on by default with te): the report says why, the run goes on
        write_record(RunDir(a.run_dir).confirm_json, not_run_record(a.tp, str(exc)))
        print(f"tptune confirm: {exc}; {RunDir(a.run_dir).confirm_json} says so", file=sys.stderr)
        return 0
    print(f"confirm: {RunDir(a.run_dir).confirm_json} ({rec['wall_s']:.0f} s)")
    for ref in ("preset", "nemo"):
        r = rec["ratios"].get(f"set/{ref}")
        if r:
            p = rec.get("projected", {}).get(f"set/{ref}")
            proj = (f"; projected to {p['layers']} layers: {interval(p | {'rounds': r['rounds']})}" if p else "")
            print(f"  set / {rec['settings'][ref]['label']}: {interval(r)}, {r['rounds']} rounds ({r['words']}){proj}")
    if rec.get("packed"):
        pk = rec["packed"]
        print(f"  packed at T {pk['capacity']}: {pk['real_tokens_per_iteration']:.0f} real tokens an iteration, "
              f"padding {pk['padding_share']:.1%}; real tokens/s " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                                             pk["tokens_per_s"].items()))
    res = rec.get("resolution") or {}
    for pair, v in (res.get("pairs") or {}).items():
        if not v["resolved"]:
            at = "with no interval yet" if v["half_width"] is None else f"at +-{v['half_width']:.2%}"
            need = ("" if v["half_width"] is None else
                    f"; +-{res['target_half_width']:.1%} would need about {v['rounds_needed'] or 'more than 200'} rounds")
            print(f"  {pair}: UNDECIDED {at}{need}")
    for line in rec["launch_failures"]:
        print(f"  launch failed: {line}", file=sys.stderr)
    if rec["loss_failures"]:
        print("CONFIRM: THE LOSS DIFFERS FROM NO OVERLAP'S BEYOND ITS REPEAT NOISE:\n  "
              + "\n  ".join(rec["loss_failures"]), file=sys.stderr)
        return 0 if a.exit_zero else 1
    return 0


def main(argv=None) -> int:
    a = add_arguments(argparse.ArgumentParser(prog="tptune confirm", description=HELP)).parse_args(argv)
    try:
        return run(a)
    except TptuneError as exc:
        print(f"tptune confirm: {exc}", file=sys.stderr)
        return 2

"""The confirm stage: the emitted set, the best NVIDIA preset and no overlap in Megatron-LM's own training loop,
launches alternating in rounds (each setting takes each position: stats.rounds.rotation), each launch a fresh
process group; then the paired iteration-time ratios and the loss rule (confirm.compare), into confirm.json."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from tptune.confirm import available, compare
from tptune.confirm.defaults import DEFAULTS
from tptune.confirm.command import ENTRY, LAUNCH_ENV, launch_env, launcher_argv, merged, model_args
from tptune.confirm.launch import run_launch
from tptune.confirm.layers import choose_layers, layers_share, ops_share
from tptune.confirm.settings import SETTINGS, confirm_settings, confirm_tp, read_json
from tptune.emit.records import write_record
from tptune.model.memory import gpu_memory_bytes
from tptune.model.spec import parse_model
from tptune.records.run_dir import RunDir
from tptune.stats.rounds import rotation

PAIRS = [("set", "preset"), ("set", "none"), ("preset", "none")]


def model_config(run: RunDir):
    raw = read_json(run.model_json, "the resolved model and workload (tptune model writes it)")
    return parse_model(dict(raw["model"]), str(run.model_json), raw["workload"])


def _launcher(template: str | None, nproc: int, port: int) -> list[str]:
    """The launch command before Megatron's arguments: torch.distributed.run with the vendored pretrain_gpt.py,
    or ``template`` ({nproc}, {port}, {entry}, {python} filled in), e.g. a site's own launcher."""
    if template is None:
        return launcher_argv(nproc, port)
    return [t.format(nproc=nproc, port=port, entry=ENTRY, python=sys.executable) for t in shlex.split(template)]


def run_confirm(run_root: str | Path, *, rounds: int = DEFAULTS["rounds"], layers: int | None = None,
                iters: int = DEFAULTS["iters"], timeout_s: float = DEFAULTS["timeout_s"],
                micro_batches: int = DEFAULTS["micro_batches"], max_layers: int = DEFAULTS["max_layers"],
                seed: int = DEFAULTS["seed"], preset: str | None = None, launcher: str | None = None,
                gpu_memory: int | None = None, tp: int | None = None, say=print) -> dict:
    """Run the stage on the run folder ``run_root`` and write its confirm.json; returns the record."""
    t0 = time.monotonic()
    if rounds < 1 or iters < 2:
        raise ValueError(f"rounds {rounds}, iters {iters}: at least 1 round of 2 iterations")
    run = RunDir(Path(run_root))
    tp = confirm_tp(run, tp)
    available.check(tp, own_launcher=launcher is not None)
    mc = model_config(run)
    timed_from = min(DEFAULTS["timed_from"], iters)
    loss_iters = min(DEFAULTS["loss_iters"], iters)
    gpu_memory = gpu_memory if gpu_memory is not None else gpu_memory_bytes()
    n, layers_why = choose_layers(mc, tp, requested=layers, max_layers=max_layers, gpu_memory=gpu_memory)
    base = model_args(mc, layers=n, tp=tp, iters=iters, micro_batches=micro_batches, seed=seed)
    settings = {s.name: s for s in confirm_settings(run, tp, preset)}
    decisions = _decisions(run)
    meta = (decisions or {}).get("meta", {})
    margin = float(meta.get("noise_floor") or 0.02)
    say(f"confirm: TP {tp}, {n} layers ({layers_why}); {rounds} rounds of {', '.join(SETTINGS)}; "
        f"preset {settings['preset'].label}")
    launches = []
    for r in range(rounds):
        for pos, name in enumerate(rotation(list(SETTINGS), r)):
            argv = merged(base, settings[name].flags)
            res = run_launch(lambda port, argv=argv: _launcher(launcher, tp, port) + argv,
                             lambda tmp: launch_env(dict(os.environ), tmp), setting=name, round_=r, position=pos,
                             log_path=run.confirm_dir / "logs" / f"r{r}-{name}.log", timeout_s=timeout_s,
                             iters=iters, timed_from=timed_from, rel_to=run.root)
            launches.append(res.to_dict())
            say(f"  round {r} {name}: " + (f"{res.median_ms:.1f} ms an iteration ({res.wall_s:.0f} s)"
                                           if res.status == "ok" else
                                           f"FAILED ({res.failure['why']}): {' | '.join(res.failure['lines'][:3])}"))
    record = summarize(launches, settings={k: v.to_dict() for k, v in settings.items()}, tp=tp, layers=n,
                       layers_why=layers_why, rounds=rounds, iters=iters, timed_from=timed_from,
                       loss_iters=loss_iters, micro_batches=micro_batches, seed=seed, margin=margin,
                       layer_record=_layer_record(run, tp), decisions=decisions,
                       command=_launcher(launcher, tp, 0) + base)
    record["wall_s"] = round(time.monotonic() - t0, 1)
    write_record(run.confirm_json, record)
    return record


def rederive_confirm(run: RunDir) -> dict | None:
    """confirm.json summarized again from its recorded launches with this code's comparisons (tptune rederive);
    None for a run without one."""
    if not run.confirm_json.is_file():
        return None
    old = json.loads(run.confirm_json.read_text())
    if "not_run" in old:
        return old
    record = summarize(old["launches"], settings=old["settings"], tp=old["tp"], layers=old["layers"],
                       layers_why=old["layers_why"], rounds=old["rounds_planned"], iters=old["iterations"],
                       timed_from=old["timed_from"], loss_iters=old["loss_iterations"],
                       micro_batches=old["micro_batches"], seed=old["seed"], margin=old["margin"],
                       layer_record=_layer_record(run, old["tp"]), decisions=_decisions(run),
                       command=old["command"])
    record["wall_s"] = old.get("wall_s")
    write_record(run.confirm_json, record)
    return record


def _decisions(run: RunDir) -> dict | None:
    return json.loads(run.decisions_json.read_text()) if run.decisions_json.is_file() else None


def _layer_record(run: RunDir, tp: int) -> dict | None:
    p = run.layer_json(tp)
    return json.loads(p.read_text()) if p.is_file() else None


def summarize(launches: list[dict], *, settings: dict, tp: int, layers: int, layers_why: str, rounds: int,
              iters: int, timed_from: int, loss_iters: int, micro_batches: int, seed: int, margin: float,
              layer_record: dict | None, command: list[str], decisions: dict | None = None) -> dict:
    """confirm.json's record from the launches (values only: tests feed it recorded launches)."""
    ratios = compare.ratios(launches, PAIRS, margin)
    numerics = {s: compare.numerics(launches, s, "none", n=loss_iters) for s in ("set", "preset")}
    failed = [f"{x['setting']} round {x['round']}: {x['failure']['kind']}: {x['failure']['why']}"
              for x in launches if x["status"] != "ok"]
    loud = [f"{s}: {key} differs from no overlap's by {v[key]['difference']} (relative), beyond the allowed "
            f"{v[key]['allowed']} (repeat noise {v[key]['repeat_noise']})"
            for s, v in numerics.items() for key in ("loss", "grad_norm") if v[key]["ok"] is False]
    set_ms = compare.rounds_of(launches, "set")
    mid = sorted(set_ms.values())[len(set_ms) // 2] if set_ms else None
    return {
        "tp": tp, "layers": layers, "layers_why": layers_why, "micro_batches": micro_batches,
        "iterations": iters, "timed_from": timed_from, "loss_iterations": loss_iters, "seed": seed,
        "rounds_planned": rounds,
        "rounds": len({x["round"] for x in launches if x["status"] == "ok"}),
        "margin": margin, "settings": settings, "ratios": ratios, "numerics": numerics,
        "loss_ok": numerics["set"]["ok"],
        "loss_failures": loud, "launch_failures": failed,
        "layers_share": layers_share(layer_record, layers, micro_batches, mid),
        "ops_share": ops_share(decisions, tp, layers, micro_batches, mid),
        "env": LAUNCH_ENV, "command": command, "launches": launches,
    }

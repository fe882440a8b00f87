"""The confirm stage: the emitted set, the best NVIDIA preset, ``nemo_tp4`` and no overlap in Megatron-LM's own
training loop, launches alternating in rounds (each arm takes each position: stats.rounds.rotation), each a fresh
training process of a launch group (confirm.group), kept as it finishes (confirm.store), rounds added until the
headline ratios resolve or the budget ends (confirm.stopping); then the paired iteration-time ratios and the loss
rule (confirm.compare), into confirm.json."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from tptune.confirm import available, compare, stopping
from tptune.confirm.command import (RUNNER, checkout_script, entry_args, launch_env, launcher_argv, merged,
                                    model_args, LAUNCH_ENV)
from tptune.confirm.defaults import DEFAULTS
from tptune.confirm.group import LaunchGroup
from tptune.confirm.layers import choose_layers, layers_share, ops_share, projection
from tptune.confirm.packed import packed_plan, tokens_per_second
from tptune.confirm.settings import SETTINGS, confirm_settings, confirm_tp, read_json
from tptune.confirm.store import LaunchStore, stage_key
from tptune.emit.records import write_record
from tptune.errors import ConfigError
from tptune.model.memory import gpu_memory_bytes
from tptune.model.spec import parse_model
from tptune.records.run_dir import RunDir
from tptune.stats.rounds import rotation

PAIRS = [("set", "preset"), ("set", "nemo"), ("set", "none"), ("preset", "none"), ("nemo", "none")]


def model_config(run: RunDir):
    raw = read_json(run.model_json, "the resolved model and workload (tptune model writes it)")
    return parse_model(dict(raw["model"]), str(run.model_json), raw["workload"])


def _launcher(template: str | None, nproc: int, port: int, tail: list[str]) -> list[str]:
    """The launch group's command: torch.distributed.run with the rank runner, or ``template`` ({nproc}, {port},
    {entry}, {python} filled in: a site's own launcher), then ``tail`` (the runner's queue and entry)."""
    if template is None:
        return launcher_argv(nproc, port) + tail
    return [t.format(nproc=nproc, port=port, entry=RUNNER, python=sys.executable) for t in shlex.split(template)] + tail


def run_confirm(run_root: str | Path, *, rounds: int = DEFAULTS["rounds"], layers: int | None = None,
                iters: int = DEFAULTS["iters"], timeout_s: float = DEFAULTS["timeout_s"],
                micro_batches: int = DEFAULTS["micro_batches"], max_layers: int = DEFAULTS["max_layers"],
                seed: int = DEFAULTS["seed"], preset: str | None = None, launcher: str | None = None,
                gpu_memory: int | None = None, tp: int | None = None, max_rounds: int = DEFAULTS["max_rounds"],
                budget_s: float = DEFAULTS["budget_s"], target: float = DEFAULTS["target_half_width"],
                megatron_lm: str | None = None, packed: bool = False, capacity: int | None = None,
                say=print) -> dict:
    """Run the stage on the run folder ``run_root`` and write its confirm.json; returns the record. ``rounds``:
    the fewest rounds; more are added (up to ``max_rounds``) until the headline ratios resolve to ``target`` or
    the next round would pass ``budget_s`` (confirm.stopping). Launches kept from a cut stage are reused.
    ``packed``: train packed THD micro-batches of the run's rollout lengths at capacity ``capacity`` (confirm.packed)."""
    t0 = time.monotonic()
    if rounds < 1 or iters < 2 or max_rounds < rounds:
        raise ValueError(f"rounds {rounds}, max_rounds {max_rounds}, iters {iters}: at least 1 round of 2 "
                         "iterations, and max_rounds >= rounds")
    run = RunDir(Path(run_root))
    tp = confirm_tp(run, tp)
    script = checkout_script(megatron_lm) if megatron_lm else None
    available.check(tp, own_launcher=launcher is not None)
    mc = model_config(run)
    pack = None
    if packed:
        if script is not None:
            raise ConfigError("--megatron-lm", ["a Megatron-LM checkout's pretrain_gpt.py reads its own data: the "
                                                "packed stage runs tptune's entry (leave --megatron-lm out)"])
        mc, bins_file, pack = packed_plan(run, mc, capacity=capacity, iters=iters, micro_batches=micro_batches, tp=tp)
    timed_from = min(DEFAULTS["timed_from"], iters)
    loss_iters = min(DEFAULTS["loss_iters"], iters)
    gpu_memory = gpu_memory if gpu_memory is not None else gpu_memory_bytes()
    n, layers_why = choose_layers(mc, tp, requested=layers, max_layers=max_layers, gpu_memory=gpu_memory)
    base = model_args(mc, layers=n, tp=tp, iters=iters, micro_batches=micro_batches, seed=seed)
    own = entry_args(seed=seed, packed=bins_file if pack else None) if script is None else []
    arms = confirm_settings(run, tp, preset)
    settings = {s.name: s for s in arms}
    names = [s.name for s in arms]
    entry = "tptune" if script is None else str(script)
    key = stage_key({"base": base, "own": own, "entry": entry, "tp": tp, "iters": iters,
                     "arms": {s.name: s.flags for s in arms}})
    store = LaunchStore(run.confirm_dir / "launches", key)
    launches = store.load(say)
    decisions = _decisions(run)
    meta = (decisions or {}).get("meta", {})
    margin = float(meta.get("noise_floor") or 0.02)
    pairs = stopping.headline_pairs(names)
    say(f"confirm: TP {tp}, {n} layers ({layers_why}); arms {', '.join(names)}; {rounds} to {max_rounds} rounds "
        f"until set / the references resolve to +-{target:.1%} or {budget_s:.0f} s pass; entry "
        f"{'tptune (confirm.trainer)' if script is None else script}"
        + (f"; {len(launches)} launches kept from a cut stage" if launches else ""))
    group: LaunchGroup | None = None
    env = launch_env(dict(os.environ))
    walls: list[float] = [x["wall_s"] for x in launches]
    stop_why = None
    try:
        r = 0
        while True:
            have = {(x["round"], x["setting"]) for x in launches}
            ratios = compare.ratios(launches, PAIRS, margin)
            if r >= max_rounds:
                stop_why = f"the round cap ({max_rounds})"
                break
            if r >= rounds and stopping.resolved(ratios, pairs, target):
                stop_why = f"resolved: every headline half-width at most {target:.1%}"
                break
            arms_r = names if r < rounds else stopping.arms_needed(names, ratios, pairs, target)
            todo = [(pos, name) for pos, name in enumerate(rotation(arms_r, r)) if (r, name) not in have]
            if r >= rounds and todo:
                per = (sum(walls) / len(walls)) if walls else timeout_s
                if time.monotonic() - t0 + per * len(todo) > budget_s:
                    stop_why = f"the time budget ({budget_s:.0f} s) would pass in another round"
                    break
            for pos, name in todo:
                for attempt in (0, 1):
                    if group is None or not group.alive():
                        if group is not None:
                            group.close(kill=True)
                        group = LaunchGroup(lambda port, q: _launcher(launcher, tp, port, [q, "--entry", entry]),
                                            env, tp, say=say)
                    argv = merged(base, settings[name].flags) + own
                    res = group.run(setting=name, round_=r, position=pos, argv=argv, env=None, timeout_s=timeout_s,
                                    log_path=run.confirm_dir / "logs" / f"r{r}-{name}.log", rel_to=run.root,
                                    iters=iters, timed_from=timed_from,
                                    timing_name="timing.json" if script is None else None)
                    if group.start_failure:
                        raise available.ConfirmUnavailable(f"the confirm stage cannot run: {group.start_failure}")
                    if attempt or res.status == "ok" or group.mode() != "fork" or not _fork_broke_cuda(run, res):
                        break
                    say("  a forked launch could not use CUDA: every launch now starts a new interpreter (spawn)")
                    env["TPTUNE_CONFIRM_SPAWN"] = "1"
                    group.close(kill=True)
                    group = None
                res.key = key
                rec = res.to_dict()
                store.save(rec)
                launches.append(rec)
                walls.append(res.wall_s)
                say(f"  round {r} {name}: " + (f"{res.iteration_ms:.1f} ms an iteration ({res.wall_s:.0f} s"
                                                + (f", SM {res.sm_mhz:.0f} MHz" if res.sm_mhz else "") + ")"
                                                if res.status == "ok" else
                                                f"FAILED ({res.failure['why']}): {' | '.join(res.failure['lines'][:3])}"))
            r += 1
    finally:
        if group is not None:
            import_s, mode = group.import_s(), group.mode()
            group.close()
        else:
            import_s, mode = None, None
    record = summarize(launches, settings={k: v.to_dict() for k, v in settings.items()}, tp=tp, layers=n,
                       layers_why=layers_why, rounds=rounds, iters=iters, timed_from=timed_from,
                       loss_iters=loss_iters, micro_batches=micro_batches, seed=seed, margin=margin,
                       layer_record=_layer_record(run, tp), decisions=decisions,
                       command=_launcher(launcher, tp, 0, ["QUEUE", "--entry", entry]) + base + own,
                       target=target, mc=mc)
    if pack:
        record["packed"] = {**pack, "tokens_per_s": tokens_per_second(pack, launches)}
    fewest = (sum(walls) / len(walls)) * len(names) * rounds if walls else None
    if fewest is not None and fewest > budget_s:
        record["over_budget"] = (f"the fewest rounds alone ({rounds} x {len(names)} launches of {fewest / len(names) / rounds:.0f} s) "
                                 f"take about {fewest:.0f} s, over the {budget_s:.0f} s budget: fewer layers (--layers) "
                                 "or micro-batches (--micro-batches) a launch would bring them under it")
        say(f"confirm: {record['over_budget']}")
    record.update({"entry": entry, "max_rounds": max_rounds, "budget_s": budget_s, "stopped": stop_why,
                   "group": {"mode": mode, "import_s": import_s}, "key": key,
                   "wall_s": round(time.monotonic() - t0, 1)})
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
                       command=old["command"], target=old.get("resolution", {}).get("target_half_width",
                                                                                    DEFAULTS["target_half_width"]),
                       mc=_model_or_none(run))
    for k in ("wall_s", "entry", "max_rounds", "budget_s", "stopped", "group", "key", "packed"):
        if k in old:
            record[k] = old[k]
    write_record(run.confirm_json, record)
    return record


def _fork_broke_cuda(run: RunDir, res) -> bool:
    """Whether a launch failed because its process was forked after CUDA was initialised (confirm.rank_runner)."""
    text = (run.root / res.log).read_text(errors="replace") if (run.root / res.log).is_file() else ""
    return ("Cannot re-initialize CUDA in forked subprocess" in text
            or ("CUDA" in text and "initialization error" in text))


def _model_or_none(run: RunDir):
    try:
        return model_config(run)
    except Exception:             # an old run folder without model.json: no projection
        return None


def _decisions(run: RunDir) -> dict | None:
    return json.loads(run.decisions_json.read_text()) if run.decisions_json.is_file() else None


def _layer_record(run: RunDir, tp: int) -> dict | None:
    p = run.layer_json(tp)
    return json.loads(p.read_text()) if p.is_file() else None


def summarize(launches: list[dict], *, settings: dict, tp: int, layers: int, layers_why: str, rounds: int,
              iters: int, timed_from: int, loss_iters: int, micro_batches: int, seed: int, margin: float,
              layer_record: dict | None, command: list[str], decisions: dict | None = None,
              target: float = DEFAULTS["target_half_width"], mc=None) -> dict:
    """confirm.json's record from the launches (values only: tests feed it recorded launches)."""
    ratios = compare.ratios(launches, PAIRS, margin)
    arms = [s for s in SETTINGS if any(x["setting"] == s for x in launches)]
    numerics = {s: compare.numerics(launches, s, "none", n=loss_iters) for s in arms if s != "none"}
    failed = [f"{x['setting']} round {x['round']}: {x['failure']['kind']}: {x['failure']['why']}"
              for x in launches if x["status"] != "ok"]
    loud = [f"{s}: {key} differs from no overlap's by {v[key]['difference']} (relative), beyond the allowed "
            f"{v[key]['allowed']} (repeat noise {v[key]['repeat_noise']})"
            for s, v in numerics.items() for key in ("loss", "grad_norm") if v[key]["ok"] is False]
    set_ms = compare.rounds_of(launches, "set")
    mid = sorted(set_ms.values())[len(set_ms) // 2] if set_ms else None
    share = layers_share(layer_record, layers, micro_batches, mid)
    full = getattr(getattr(mc, "model", None), "num_layers", None)
    projected = {}
    for a, b in PAIRS:
        ref = compare.rounds_of(launches, b)
        ref_mid = sorted(ref.values())[len(ref) // 2] if ref else None
        p = projection(ratios.get(f"{a}/{b}"), share, layers, full, ref_mid, mid)
        if p:
            projected[f"{a}/{b}"] = p
    return {
        "tp": tp, "layers": layers, "layers_why": layers_why, "micro_batches": micro_batches,
        "iterations": iters, "timed_from": timed_from, "loss_iterations": loss_iters, "seed": seed,
        "rounds_planned": rounds,
        "rounds": len({x["round"] for x in launches if x["status"] == "ok"}),
        "margin": margin, "settings": settings, "ratios": ratios, "numerics": numerics,
        "loss_ok": numerics["set"]["ok"] if "set" in numerics else None,
        "loss_failures": loud, "launch_failures": failed,
        "layers_share": share,
        "projected": projected,
        "resolution": stopping.verdict(ratios, stopping.headline_pairs(arms), target),
        "ops_share": ops_share(decisions, tp, layers, micro_batches, mid),
        "env": LAUNCH_ENV, "command": command, "launches": launches,
    }

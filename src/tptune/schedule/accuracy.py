"""How close tptune's wall-time figures come on the committed runs, each for what it is (docs/wall-time.md;
benchmarks/wall_fit.py --write records it in results/wall_replay.json, which the docs quote):

- ``replayed_s``: the run's own sessions replayed on its own node (tptune predict). The replay is given the
  run's own start-up, held times and gaps, so its closeness to wall_s.txt is a regression test of the
  scheduler (schedule.simulate lays the sessions as the workflow ran them), not the accuracy of a prediction.
- ``before_s``: the prediction made before measuring, from the run's config alone (tptune plan, schedule.
  plan_estimate, with the committed fit): the accuracy a user gets; ``defaults`` marks the runs made with the
  te defaults' search and round budget, what a new run gets.
- ``tp8``: where the run measured two TPs below 8, the 8-GPU figure extrapolates TP 8 (schedule.replay): the
  smallest and largest factor its sessions were scaled by.
"""
from __future__ import annotations

from pathlib import Path

from tptune.measure.preflight import resolve_here
from tptune.schedule.plan_estimate import estimate
from tptune.schedule.replay import fits, predict
from tptune.schedule.wall_fit import fitted_runs
from tptune.settings.backend_defaults import BY_BACKEND
from tptune.settings.resolve import load_run_config

DEFAULT_ROUNDS = (BY_BACKEND[("timing", "min_rounds")]["te"], 4)   # the te defaults' round budget (config.yaml)
EXTRAPOLATED_GPUS = 8


def is_default_budget(s) -> bool:
    """A te run measured with the defaults' search and round budget (settings.backend_defaults)."""
    return (s.backend == "te" and s.search.mode == BY_BACKEND[("search", "mode")]["te"]
            and (s.timing.min_rounds, s.timing.max_rounds) == DEFAULT_ROUNDS)


def run_figures(results: Path, table: dict, base_dir: Path) -> dict:
    """{"runs": {run: {wall_s, replayed_s}}, "before_measuring": [{run, wall_s, before_s, defaults}], "tp8": {run:
    {lo, hi}}} over every fitted run under ``results`` (schedule.wall_fit.fitted_runs), ``table`` the wall-time
    fit, model files read from ``base_dir`` (the repository)."""
    runs, before, tp8 = {}, [], {}
    for run, sessions, wall in fitted_runs(results)[0]:
        rel = run.root.relative_to(results).as_posix()
        cfg, source, _ = load_run_config([run.config_json])
        s = resolve_here(cfg, source=source, base_dir=base_dir, check_hardware=False)
        runs[rel] = {"wall_s": wall, "replayed_s": round(predict(run, table=table).predicted_wall_s, 3)}
        before.append({"run": rel, "wall_s": wall, "before_s": round(estimate(s, table=table).predicted_wall_s, 1),
                       "defaults": is_default_budget(s)})
        tps = sorted({x.tp for x in sessions})
        if len(tps) >= 2 and tps[-1] < EXTRAPOLATED_GPUS and fits(tps[-1] * 2, EXTRAPOLATED_GPUS):
            p = predict(run, EXTRAPOLATED_GPUS, table=table)
            if p.extrapolation_range:
                tp8[rel] = {"lo": round(p.extrapolation_range[0], 3), "hi": round(p.extrapolation_range[1], 3)}
    return {"runs": runs, "before_measuring": before, "tp8": tp8}

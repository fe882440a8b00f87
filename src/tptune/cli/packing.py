"""The packing stage's steps (issue 53, docs/packing.md), which the workflow's rules/packing.smk runs through
cli.main: the plan (which TP and capacities the packed sessions measure, after decisions.json), and the decision
(packing.json and each framework's settings, after the packed sessions). The sessions themselves are measured by
cli.main's measure-packed, as every session is (cli.main._measure_session)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import yaml

from tptune.decide.packing import packing_record
from tptune.emit.packing import CFG_NAME, write_packing
from tptune.emit.records import write_record
from tptune.errors import ConfigError, TptuneError
from tptune.packing import emit as frameworks
from tptune.packing.spec import PackingSpec
from tptune.records import load
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.search.packed import capacities, packing_tp, plan_record, settings_of


def load_spec(config_json: str | Path) -> tuple[PackingSpec, np.ndarray]:
    """The run's ``workload.packing`` and its lengths, read from the folder the run was resolved in (config.json's
    _base_dir; the checkout here where the run folder was copied from another machine)."""
    path = Path(config_json)
    cfg = load.read_json(path)
    spec = PackingSpec.from_config(cfg)
    if spec is None:
        raise ConfigError(str(path), ["field 'workload.packing': absent: this run has no packing stage "
                                      "(docs/packing.md)"])
    base = Path(cfg.get("_base_dir") or ".")
    rel = spec.lengths if isinstance(spec.lengths, str) else (spec.lengths or {}).get("file")
    if isinstance(rel, str) and not Path(rel).is_absolute() and not (base / rel).exists() and Path(rel).exists():
        base = Path(".")
    return spec, spec.load(base)


def _layer_record(run: RunDir, tp: int) -> dict:
    return load.read_json(run.layer_json(tp))


def write_plan(s, run: RunDir, spec: PackingSpec, lengths: np.ndarray, out: Path) -> dict:
    """packing/plan.json: the TP (search.packed.packing_tp), its capacities and the settings its block wrote."""
    meta = load.decisions(run).get("meta") or {}
    layer_tps = [tp for tp in s.tp_sizes if run.layer_json(tp).is_file()]
    tp, why = packing_tp(meta.get("model_tp"), layer_tps)
    caps, settings = [], None
    if tp is not None:
        caps = capacities(s, spec, lengths, tp)
        settings = settings_of(_layer_record(run, tp), s)
    rec = plan_record(s, tp, why, caps, settings)
    write_record(out, rec)
    return rec


def _set_files(run: RunDir, meta: dict, tp: int) -> tuple[list[str] | None, dict | None, dict | None, str | None]:
    """(the set's Megatron-LM switches, its TransformerConfig overrides, its ub_cfgs, its yaml's text) at ``tp``
    from decisions.json's file sets; Nones where the run wrote none (the torch backend)."""
    files = ((((meta.get("files") or {}).get("sets") or {}).get(str(tp))) or {}).get("files") or {}

    def text(key):
        name = files.get(key)
        return load.text(run.file(name)) if name else None

    flags = text("megatron_flags")
    switches = None if flags is None else [tok for line in flags.splitlines()
                                           if line.strip() and not line.lstrip().startswith("#")
                                           for tok in shlex.split(line)]
    over = text("overrides")
    ub = text("ub_cfgs_json")
    return (switches, yaml.safe_load(over) if over else None, json.loads(ub) if ub else None,
            text("ub_cfgs_yaml"))


def decide(s, run: RunDir, spec: PackingSpec, lengths: np.ndarray) -> dict:
    """packing.json and the framework files (emit.packing) from the plan and the packed sessions; returns the
    record."""
    plan = load.read_json(run.packing_plan_json)
    tp = plan.get("tp")
    sessions = {}
    for cap in plan.get("capacities") or []:
        folder = run.packed_session(tp, cap)
        if not (folder / "session.json").is_file():
            raise TptuneError(f"{folder}/session.json: no such file (the packed session at T = {cap}; the "
                              "workflow's measure_packed rule measures it)")
        sessions[cap] = load_session(folder, run.session_name(folder), strict=False)
    meta = load.decisions(run).get("meta") or {}
    switches, overrides, ub_cfgs, cfg_text = _set_files(run, meta, tp) if tp else (None, None, None, None)
    rec, d = packing_record(s, spec, lengths, plan, sessions, ub_cfgs, meta.get("memory"))
    fws, header = [], []
    if d is not None:
        fws = frameworks.all_settings(d.capacity, tp, CFG_NAME, switches, overrides)
        rec["frameworks"] = [{**f.to_dict(), "option_problems": frameworks.option_problems(f)} for f in fws]
        header = [f"packing.json's answer (TP {tp}): {d.sentence}"]
        if cfg_text is None:
            header.append(f"The {s.backend} backend wrote no TE userbuffers file (a CPU run measures the torch "
                          f"backend's chunked overlap, {plan['settings']['set']}): a GPU run writes "
                          f"{CFG_NAME} beside these, its set at TP {tp}.")
    write_packing(run, rec, fws, header, cfg_text)
    return rec

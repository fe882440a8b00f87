"""The three settings a confirm launches, read from the run folder:

  set     the emitted set at the model TP as written: ``megatron_flags.tp<N>.txt`` (or the unsuffixed
          ``megatron_flags.txt`` of a one-TP run), its ``--tp-comm-overlap-cfg`` file beside it;
  preset  the best NVIDIA preset the run's layer stage measured at the model TP under Megatron's default
          switches: among the block's ``ub.<preset>`` settings that ran (no knob overrides, no recipe
          environment, not one of the run's own presets in presets/), those whose ub_cfgs Megatron runs with
          its default switches (te.megatron_flags.block_switches), the fastest block; its resolved ub_cfgs
          written as a Megatron yaml under confirm/;
  nemo    the preset the README's TP 4 headline compares to (``nemo_tp4``), as its own arm wherever the run's
          block measured it at the TP and it is not already the best preset (REFERENCE_PRESETS);
  none    no overlap (sequence parallelism on, as in every setting).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tptune.cases import parse_case_id
from tptune.confirm.command import flags_file_args
from tptune.emit.megatron_switches import write_overlap_yaml
from tptune.errors import ConfigError
from tptune.records.run_dir import RunDir
from tptune.te.megatron_flags import MEGATRON_FIELDS, block_switches, megatron_flags
from tptune.te.ubcfg import load_preset

SETTINGS = ("set", "preset", "nemo", "none")
# The presets a headline quotes a gain against, each run as its own arm: setting name -> preset.
REFERENCE_PRESETS = {"nemo": "nemo_tp4"}
DEFAULT_SWITCHES = dict(MEGATRON_FIELDS, tp_comm_overlap=True)


@dataclass(frozen=True)
class Setting:
    name: str                 # SETTINGS
    label: str                # what the report calls it
    flags: list[str]          # its TP-overlap flags (the model's and the loop's are the same for all)
    source: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"label": self.label, "flags": self.flags, **self.source}


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ConfigError(str(path), [f"no such file: {what}"])
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), [f"not JSON ({exc.msg}, line {exc.lineno}): {what}"]) from None


def confirm_tp(run: RunDir, tp: int | None = None) -> int:
    """The TP to confirm: ``tp`` when given, else the model TP; it must have an emitted set (meta.files.sets)."""
    meta = read_json(run.decisions_json, "the run's decisions (tptune decide writes it)").get("meta", {})
    sets = sorted(int(k) for k in ((meta.get("files") or {}).get("sets") or {}))
    chosen = meta.get("model_tp") if tp is None else tp
    if not isinstance(chosen, int) or chosen < 2:
        raise ConfigError(str(run.decisions_json), [f"{'meta.model_tp' if tp is None else '--tp'} = {chosen!r}: the "
                                                    "confirm stage needs a TP of at least 2 (TP overlap has nothing "
                                                    "to overlap at TP 1)"])
    if sets and chosen not in sets:
        raise ConfigError(str(run.decisions_json), [f"TP {chosen} has no emitted set (sets at TP "
                                                    f"{', '.join(map(str, sets))}): give --tp with one of them"])
    return chosen


def emitted_set(run: RunDir, tp: int) -> Setting:
    path = run.root / f"megatron_flags.tp{tp}.txt"
    if not path.is_file() and (run.root / "megatron_flags.txt").is_file():
        path = run.root / "megatron_flags.txt"
    flags = flags_file_args(path)
    return Setting("set", f"the emitted TP {tp} set", flags, {"flags_file": path.name})


def preset_candidates(run: RunDir, tp: int) -> list[dict]:
    """The layer stage's NVIDIA presets at ``tp`` that ran, each with its block median and whether Megatron's
    default switches run it ({"preset", "median_ms", "switches_default", "why"}), fastest first."""
    rec = read_json(run.layer_json(tp), f"the layer stage's record at TP {tp} (the block's presets)")
    own = {p.stem for p in run.presets.glob("*.yaml")}
    out = []
    for row in rec.get("settings", []):
        variant = row.get("variant", "")
        if not variant.startswith("ub.") or row.get("status") != "ok" or not row.get("median_ms"):
            continue
        case = parse_case_id(row["case"])
        name = case.variant.preset
        if case.variant.overrides or name in own or row.get("environment"):
            continue
        cfgs = load_preset(name, [run.presets])
        try:
            sw = block_switches(cfgs)
        except ValueError as exc:
            out.append({"preset": name, "median_ms": row["median_ms"], "switches_default": False, "why": str(exc)})
            continue
        default = sw == DEFAULT_SWITCHES
        out.append({"preset": name, "median_ms": row["median_ms"], "switches_default": default,
                    "why": None if default else "needs switches other than Megatron's defaults: " +
                    ", ".join(f"{k}={v}" for k, v in sw.items() if DEFAULT_SWITCHES[k] != v)})
    return sorted(out, key=lambda c: c["median_ms"])


def best_preset(run: RunDir, tp: int, name: str | None = None) -> Setting:
    """The preset setting: ``name`` when given (any preset tptune knows), else the fastest candidate run under
    Megatron's default switches."""
    cands = preset_candidates(run, tp) if run.layer_json(tp).is_file() or name is None else []
    if name is None:
        ok = [c for c in cands if c["switches_default"]]
        if not ok:
            raise ConfigError(str(run.layer_json(tp)), [
                f"no NVIDIA preset ran in the TP {tp} block under Megatron's default switches "
                f"(measured: {', '.join(c['preset'] for c in cands) or 'none'}): name one with --preset"])
        name, why = ok[0]["preset"], (f"the fastest NVIDIA preset of the TP {tp} block under Megatron's default "
                                      f"switches ({ok[0]['median_ms']:.2f} ms a block)")
    else:
        why = "named with --preset"
    return preset_setting(run, "preset", name, why, {"candidates": cands})


def preset_setting(run: RunDir, setting: str, name: str, why: str, extra: dict | None = None) -> Setting:
    """The arm ``setting`` running NVIDIA's preset ``name`` under the switches its ub_cfgs need, its resolved
    ub_cfgs written as a Megatron yaml under confirm/."""
    cfgs = load_preset(name, [run.presets])
    yml = write_overlap_yaml(run.confirm_dir / f"{name}.yaml", cfgs)
    flags = [t for f in megatron_flags(block_switches(cfgs), str(yml.resolve())) for t in shlex.split(f)]
    return Setting(setting, name, flags, {"preset": name, "why": why, "overlap_cfg": str(yml.relative_to(run.root)),
                                         **(extra or {})})


def reference_arms(run: RunDir, tp: int, best: str) -> list[Setting]:
    """The headline's reference presets (REFERENCE_PRESETS) that the TP ``tp`` block ran under Megatron's
    default switches, other than the best preset ``best``."""
    if not run.layer_json(tp).is_file():
        return []
    ran = {c["preset"]: c for c in preset_candidates(run, tp) if c["switches_default"]}
    return [preset_setting(run, setting, name, f"the README's headline reference ({ran[name]['median_ms']:.2f} ms "
                           "a block)") for setting, name in REFERENCE_PRESETS.items() if name in ran and name != best]


def no_overlap() -> Setting:
    return Setting("none", "no overlap", [])


def confirm_settings(run: RunDir, tp: int, preset: str | None = None) -> list[Setting]:
    """The arms, in SETTINGS order: the set, the best preset, the headline's references, no overlap."""
    best = best_preset(run, tp, preset)
    return [emitted_set(run, tp), best, *reference_arms(run, tp, best.label), no_overlap()]

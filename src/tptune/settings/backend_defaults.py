"""Defaults that depend on the backend: config/config.yaml gives ``auto`` for these fields, and a run
resolves each to its backend's value once the backend is known (a value a run config gives is kept).

The te values are the search and round budget the committed GPU evidence supports (the knob search over
tptune.te.methods.PROVEN_GROUPS, 2 to 4 rounds, every TP in tp_sizes measured, TP 2's idle worker groups
kept warm through the TP 4 searches: benchmarks/knob_evidence.py, the tp24 runs under results/). The
torch values are the CPU default's, unchanged.
"""
from __future__ import annotations

import copy

from tptune.te.methods import PROVEN_GROUPS

AUTO = "auto"

# (block, key) -> {backend: value}. search.te_presets: by the workload's dtype (bf16 / fp8), see _presets.
BY_BACKEND: dict[tuple[str, str], dict[str, object]] = {
    ("search", "mode"): {"te": "knobs", "torch": "bisect"},
    ("timing", "warmup"): {"te": 3, "torch": 2},
    ("timing", "iters"): {"te": 10, "torch": 5},
    ("timing", "min_rounds"): {"te": 2, "torch": 3},
    ("decision", "explore_all_tps"): {"te": True, "torch": False},
    ("launcher", "idle_timeout_s"): {"te": 300, "torch": 30},
    ("confirm", "enabled"): {"te": True, "torch": False},
}
# NVIDIA's presets a te run is measured beside (ops and block), by dtype; the torch backend measures none
# of them but records the one name it always has.
PRESETS = {"te": {"bf16": ["nemo_tp4", "nvidia_bf16_tp2"], "fp8": ["nvidia_fp8_tp4", "nvidia_fp8_tp2"]},
           "torch": {"bf16": ["nemo_tp4"], "fp8": ["nemo_tp4"]}}


def _presets(backend: str, fp8: bool) -> list[str]:
    return list(PRESETS.get(backend, PRESETS["torch"])["fp8" if fp8 else "bf16"])


def auto_fields(config: dict) -> list[str]:
    """The dotted names of the fields this config leaves at ``auto`` (run-wide and per op)."""
    out = []
    blocks = [("", config)] + [(f"op_settings.{op}.", own) for op, own in (config.get("op_settings") or {}).items()
                               if isinstance(own, dict)]
    for prefix, cfg in blocks:
        for block, key in [*BY_BACKEND, ("search", "te_presets")]:
            if (cfg.get(block) or {}).get(key) == AUTO:
                out.append(f"{prefix}{block}.{key}")
    return out


def resolve(config: dict, backend: str, fp8: bool = False) -> dict:
    """A copy of ``config`` with every ``auto`` of the backend-dependent fields replaced by the backend's
    value (run-wide and in op_settings); nothing else changes."""
    out = copy.deepcopy(config)
    blocks = [out] + [own for own in (out.get("op_settings") or {}).values() if isinstance(own, dict)]
    for cfg in blocks:
        for (block, key), values in BY_BACKEND.items():
            if (cfg.get(block) or {}).get(key) == AUTO:
                cfg[block][key] = values.get(backend, values["torch"])
        if (cfg.get("search") or {}).get("te_presets") == AUTO:
            cfg["search"]["te_presets"] = _presets(backend, fp8)
    return out


def recorded(config: dict, backend: str, fp8: bool = False) -> dict:
    """What a run's config.json records of ``config``: the backend it resolved to (where it was ``auto``),
    every backend-dependent ``auto`` resolved, and the knob groups a knob search searches where the config
    leaves them to the default (``proven``: tptune.te.methods.PROVEN_GROUPS, which the committed runs derive),
    so the record replays as measured on any machine (tptune rederive on a CPU-only host resolves
    ``backend: auto`` to torch) and under later defaults."""
    out = resolve(config, backend, fp8)
    if out.get("backend", "auto") == AUTO:
        out["backend"] = backend
    blocks = [out] + [own for own in (out.get("op_settings") or {}).values() if isinstance(own, dict)]
    for cfg in blocks:
        search = cfg.get("search") or {}
        knobs = search.get("knobs")
        if search.get("mode") == "knobs" and (knobs is None or isinstance(knobs, dict)) and \
                (knobs or {}).get("groups", "proven") == "proven":
            search["knobs"] = {**(knobs or {}), "groups": list(PROVEN_GROUPS)}
    return out

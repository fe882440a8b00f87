"""What a measuring job measures with: a session's measurement settings, their digest, and the op
settings the launcher takes from them."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from tptune.search.steps import canary_case, point_contenders, point_members, step_cases
from tptune.settings.blocks import OpSettings
from tptune.settings.resolve import Settings

# -- what a measuring job measures with ----------------------------------------------------------
# A session's *measurement settings*: exactly what its measuring job hands the launcher, and nothing
# else. The measuring rules' params are these (so a changed setting re-measures exactly the sessions
# it touches, and a decision-only one none), the job refuses to measure when the run's config.json
# gives other ones than it was scheduled with, and session.json records them ("settings").
# Everything else in the run config only derives (decisions, configs, report) or runs the machinery
# (launcher pool, time-outs, retries): docs/run-integrity.md.
MEASURE_LAUNCHER_KEYS = ("multicast", "env", "cpu_threads_per_rank")
TRAP_ONLY_WORKLOAD = ("packed_sequences", "sequence_parallel")


def measurement(s: Settings, op: OpSettings, members: list[str] | None, *, canary: str | None,
                margin: float, tie_margin: float | None, evidence: bool, contenders: list[str] | None = None,
                always: list[str] | None = None, layer: dict | None = None) -> dict:
    """A session's measurement settings (see above). ``members`` None: they follow from the job's
    input files (the layer stage's block settings come from the TP points). The run's ``faults`` (a
    testing aid that makes a member fail, as a machine might) are not among them: changing them
    re-measures nothing; ``snakemake -R $(tptune failed <run>)`` re-measures failed sessions."""
    model = {k: v for k, v in s.model.to_dict().items() if k != "source"}   # what is measured, not where it was read
    # named by the traps only: the benches always measure with sequence parallelism and a fixed shape
    model["workload"] = {k: v for k, v in model["workload"].items() if k not in TRAP_ONLY_WORKLOAD}
    return {"backend": s.backend, "device": s.device, "model": model,
            "timing": op.timing.as_dict(), "check": bool(op.check), "atomic_gemm": bool(op.search.atomic_gemm),
            "layer": layer, "members": members, "contenders": contenders, "always": always, "canary": canary,
            "evidence": evidence, "margin": margin, "tie_margin": tie_margin,
            "launcher": s.launcher.given_or_none(*MEASURE_LAUNCHER_KEYS)}


def launcher_op_settings(m: dict) -> dict:
    """The op settings Launcher.session takes, from a measurement (nothing else reaches it)."""
    return {"timing": dict(m["timing"]), "check": m["check"], "search": {"atomic_gemm": m["atomic_gemm"]},
            **({"layer": m["layer"]} if m["layer"] is not None else {})}


def settings_digest(m: dict) -> str:
    return hashlib.sha256(json.dumps(m, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_measurement(s: Settings, op: str, tp: int, dim: str, prev: dict | None) -> dict:
    cases = step_cases(s, op, tp, dim, prev)
    win, floor = s.decision.step_margins
    return measurement(s, s.op(op), [c.id for c in cases], canary=None, margin=win, tie_margin=floor,
                       evidence=False)


def point_measurement(s: Settings, op: str, tp: int, results: list[dict]) -> dict:
    members, _ = point_members(s, op, tp, results)
    ids = [c.id for c in members]
    return measurement(s, s.op(op), ids, canary=canary_case(s, tp).id, margin=s.decision.noise_floor,
                       tie_margin=None, evidence=True,
                       contenders=point_contenders(members))


def layer_measurement(s: Settings, tp: int) -> dict:
    """The layer stage of one TP: its block settings follow from the TP points (its inputs)."""
    op = replace(s.op(s.ops[0]), check=True)
    return measurement(s, op, None, canary=canary_case(s, tp).id, margin=s.decision.noise_floor,
                       tie_margin=None, evidence=True, layer=s.layer.block_settings()) | (
        {"presets": list(s.search.te_presets or [])} if s.backend == "te" else {})


# what a session's members are follows from the searches before it, not from the run config
MEMBER_KEYS = ("members", "contenders", "always")


def settings_unchanged(s: Settings, name: str, recorded: dict | None) -> bool:
    """Whether a session's recorded measurement settings (session.json "settings") are those the run config
    gives its kind now, its members aside (they follow from the searches): a session the workflow keeps rather
    than re-measures, as far as the config decides it. ``name``: "qkv/tp2/point", "layer/tp2",
    "qkv/tp2/<dim>/step<k>"."""
    if not isinstance(recorded, dict):
        return False
    parts = name.split("/")
    try:
        tp = int(parts[1][2:])
        if parts[0] == "layer":
            now = layer_measurement(s, tp)
        elif parts[2] == "point":
            now = measurement(s, s.op(parts[0]), None, canary=canary_case(s, tp).id, margin=s.decision.noise_floor,
                              tie_margin=None, evidence=True)
        else:
            win, floor = s.decision.step_margins
            now = measurement(s, s.op(parts[0]), None, canary=None, margin=win, tie_margin=floor, evidence=False)
    except (IndexError, ValueError, KeyError):
        return False
    strip = (lambda m: {k: v for k, v in m.items() if k not in MEMBER_KEYS})
    return strip(json.loads(json.dumps(now, default=str))) == strip(recorded)

"""Every recorded block session under a results tree, and which of them measured the same pair.

Two block sessions measured the same pair when they ran the same workload on the same kind of node (the GPU's
name, the node's GPU count, the model and workload as run.json records them, the block's layers, the TP) and
each holds a member for both settings of the pair. A setting is known by what it runs, not by its case name:
a preset file (``presets/<name>.yaml`` in the session's run folder or a folder above it) by its entries, with
YAML's true/false read as 1/0 (a copy written by ``tptune verify`` and the run's own file are the same
settings); a preset tptune ships (config/presets) and TE's defaults by their name; a file that was not kept by
the run that a ``pooled_with.json`` names as that run's tuned file (records.sessions.load_pooled_with).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tptune.records.preset_identity import file_identity
from tptune.records.run_dir import SESSION_JSON
from tptune.records.sessions import Session, load_session

SHIPPED_PRESETS = Path(__file__).resolve().parents[3] / "config" / "presets"


@dataclass(frozen=True)
class BlockSession:
    rel: str                       # the session folder relative to the results root
    scope: str                     # what must match for two sessions to pool (module doc)
    identity: dict[str, str]       # case id -> the setting it runs
    session: Session


def _preset_file(folder: Path, root: Path, name: str) -> Path | None:
    """presets/<name>.yaml in the nearest folder at or above ``folder`` (up to ``root``) that has one."""
    for d in [folder, *folder.parents]:
        p = d / "presets" / f"{name}.yaml"
        if p.exists():
            return p
        if d == root:
            return None
    return None


def _scope(session: Session, tp: int) -> str | None:
    point = next((p for p in session.points.values() if p.environment and p.model), None)
    if point is None:
        return None
    env = point.environment
    model = {k: v for k, v in point.model.items() if k != "source"}
    layers = ((point.settings or {}).get("layer") or {}).get("num_layers") or 2
    node = len(str(env.get("driver") or "").split("\n"))
    return json.dumps({"gpu": env.get("gpu_name"), "node_gpus": node, "model": model, "layers": layers, "tp": tp},
                      sort_keys=True)


def declared_files(root: Path) -> dict[tuple[str, str], str]:
    """(session folder relative to root, case) -> identity, for the sessions a run's pooled_with.json names
    as measuring that run's tuned file where the session's own run kept no copy of it."""
    out = {}
    for pw in sorted(root.rglob("pooled_with.json")):
        run = pw.parent
        for o in json.loads(pw.read_text()):
            tp = o.get("tp")
            tuned = run / "presets" / (f"tuned_tp{tp}.yaml" if tp else "")
            if not tp:
                found = sorted((run / "presets").glob("tuned_tp*.yaml"))
                tuned = found[0] if len(found) == 1 else None
            if tuned is None or not tuned.exists():
                continue
            rel = (run / o["session"]).resolve().relative_to(root.resolve()).as_posix()
            out[(rel, o["tuned"])] = file_identity(tuned)
    return out


def index(root: str | Path) -> list[BlockSession]:
    """Every block session (sessions/layer/tp<N>/session.json) under ``root``, legacy runs aside."""
    root = Path(root).resolve()
    declared = declared_files(root)
    shipped = {p.stem for p in SHIPPED_PRESETS.glob("*.yaml")} | {"te"}
    out = []
    for sj in sorted(root.rglob(f"sessions/layer/tp*/{SESSION_JSON}")):
        folder = sj.parent
        rel = folder.relative_to(root).as_posix()
        if rel.startswith("legacy/"):
            continue
        session = load_session(folder, rel, strict=False)
        tp = int(session.record.get("tp") or folder.name.removeprefix("tp"))
        scope = _scope(session, tp)
        if scope is None:
            continue
        ident = {}
        for cid in session.points:
            variant = cid.split(f"layer-tp{tp}-", 1)[-1]
            name = variant.removeprefix("ub.")
            if not variant.startswith("ub.") or name in shipped:
                ident[cid] = "preset:" + name
            elif (f := _preset_file(folder, root, name)) is not None:
                ident[cid] = file_identity(f)
            else:
                ident[cid] = declared.get((rel, cid), f"unknown:{rel}:{cid}")
        out.append(BlockSession(rel, scope, ident, session))
    return out


def same_pair(sessions: list[BlockSession], anchor: str, a: str, b: str) -> list[tuple[BlockSession, str, str]]:
    """Every session of ``sessions`` that measured the pair ``a`` / ``b`` of the session ``anchor`` (folder
    relative to the root) on its scope: [(session, a's case there, b's case there)], the anchor first."""
    own = next((s for s in sessions if s.rel == anchor), None)
    if own is None:
        raise KeyError(f"{anchor}: no block session recorded there (expected <run>/sessions/layer/tp<N>)")
    for c in (a, b):
        if c not in own.identity:
            raise KeyError(f"{anchor}: no member {c} (it has {', '.join(sorted(own.identity))})")
    ia, ib = own.identity[a], own.identity[b]
    out = []
    for s in [own] + [s for s in sessions if s is not own and s.scope == own.scope]:
        ca = [c for c, i in s.identity.items() if i == ia]
        cb = [c for c, i in s.identity.items() if i == ib]
        if ca and cb:
            out.append((s, a if s is own else ca[0], b if s is own else cb[0]))
    return out

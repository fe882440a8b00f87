"""Which knob groups the te backend's default knob search searches: a stated rule over every committed
knob run (issue 52), and the committed record it derives (``tptune/data/knob_groups.json``).

Evidence. A finished knob search (``results/**/search/<op>/tp<N>/knobs/result.json``) records its path:
after the references, one session per knob group (on some of the op's GEMMs) that measured the
incumbent beside the group's values and kept one of them (search.knob_search.changes). For each such
session, the kept setting against the incumbent over the session's rounds (per-round log ratios, paired
by round) is one block; a group's blocks are pooled, each session a block (stats.pooled.pooled_ratio, the
definition every pooled figure uses). The pooled kept / incumbent is what searching the group changed in
what was kept, on average over every op, TP, model and node it was searched on: a session that froze the
group at the incumbent reads 1 in every round, one that froze it at a cheaper tying value reads that
value's ratio, one that moved reads its gain.

Rule. A group is in the default when its pooled kept / incumbent interval lies entirely below
1 − EFFECT, EFFECT = 1%, the search's step margin (config/config.yaml's decision.step_margin: the
smallest knob effect a search step acts on). A group that was never searched has no evidence and stays
out; ``search.knobs.groups: all`` searches every group.

What the interval does not say. The pooled interval comes from the rounds' spread inside each session;
the sessions' own levels differ by more than their rounds explain for nearly every group (the record
says ``heterogeneous``), so the interval is that of the sessions measured, not of the next model's. And
a moved session's kept setting was chosen on the rounds that score it, so a group's pooled ratio leans
towards its gain (a frozen session has no such lean: it keeps the cheaper value, not the faster one).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tptune.records.sessions import load_session
from tptune.stats.pooled import pooled_ratio
from tptune.stats.rounds import point_rounds
from tptune.te.methods import ALL_GROUPS

EFFECT = 0.01            # config/config.yaml decision.step_margin (tests/search/test_knob_rule.py holds them equal)
RECORD = "knob_groups.json"
RULE = ("a knob group is searched by default when the kept / incumbent ratio of its knob sessions, pooled over "
        "every committed knob run (stats.pooled, each session a block), has its 95% interval entirely below "
        "1 - effect; effect = the search's step margin")


def group_blocks(results: Path) -> dict[str, dict]:
    """Per knob group, over every finished knob search under ``results``: its sessions as pooled_ratio's
    blocks (kept's rounds, the incumbent's rounds), how many moved the kept setting beyond the step margin,
    and the runs it was searched in."""
    out: dict[str, dict] = {g: {"blocks": [], "moved": 0, "runs": set()} for g in ALL_GROUPS}
    for f in sorted(Path(results).glob("**/search/*/tp*/knobs/result.json")):
        rec = json.loads(f.read_text())
        if not rec.get("done"):
            continue
        run = f.parents[4]
        where = {e["label"]: e["session"] for e in rec["sessions"]}
        moved = {c["session"]: bool(c.get("moved")) for c in rec.get("changes") or []}
        incumbent = None
        for entry in rec["path"]:
            if entry["session"] == "refs":
                incumbent = entry["kept"]
                continue
            group = entry["session"].split(":")[0]
            points = load_session(run / where[entry["session"]]).points
            g = out.setdefault(group, {"blocks": [], "moved": 0, "runs": set()})
            name = f"{run.relative_to(results).as_posix()}:{rec['op']}:tp{rec['tp']}:{entry['session']}"
            g["blocks"].append((name, point_rounds(points.get(entry["kept"])), point_rounds(points.get(incumbent))))
            g["moved"] += moved.get(entry["session"], False)
            g["runs"].add(run.relative_to(results).as_posix())
            incumbent = entry["kept"]
    return out


def derive(results: Path, effect: float = EFFECT) -> dict:
    """The rule applied over every committed knob run under ``results``: per group its sessions, the
    sessions that moved, the runs, the pooled kept / incumbent and whether it is in the default; the
    default groups in ALL_GROUPS' order (the search's)."""
    return derive_from(group_blocks(results), effect)


def derive_from(blocks: dict[str, dict], effect: float = EFFECT) -> dict:
    """derive over ``blocks`` already read (group_blocks), so one read serves several effects."""
    groups = {}
    for name, g in blocks.items():
        p = pooled_ratio(g["blocks"])
        pooled = None if p is None else {k: v for k, v in p.to_dict().items() if k != "sessions"}
        inside = pooled is not None and pooled["hi"] is not None and pooled["hi"] < 1 - effect
        groups[name] = {"sessions": len(g["blocks"]), "moved": g["moved"], "runs": len(g["runs"]),
                        "pooled": pooled, "default": inside}
    return {"about": "python benchmarks/knob_evidence.py --write (tptune.search.knob_rule): " + RULE,
            "effect": effect, "runs": len({r for g in blocks.values() for r in g["runs"]}),
            "groups": groups, "default": [g for g in ALL_GROUPS if groups.get(g, {}).get("default")]}


def committed() -> dict:
    """The committed record of the derivation (tptune/data/knob_groups.json, which te.methods' default
    groups are read from)."""
    return json.loads(resources.files("tptune").joinpath("data", RECORD).read_text())


def describe(name: str, g: dict) -> str:
    """One group's line: its pooled kept / incumbent [interval], rounds and sessions, and how many moved."""
    p = g["pooled"]
    if p is None:
        return f"{name}: never searched"
    return (f"{name}: {p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}], {p['rounds']} rounds pooled over "
            f"{g['sessions']} sessions in {g['runs']} runs ({g['moved']} moved)")

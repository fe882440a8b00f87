"""The ``window`` and ``first_member`` figure kinds (report.quoted_figures): figures of the benchmark
calibrations that cut a recorded round's iterations by GPU time (stats.window), and round 0's first member
over a list of runs' sessions, so that none of them is worked out by hand.

``window`` reads a calibration recording (``file`` under results/: window.json of ``tptune calibrate-window``,
or the JSON of benchmarks/window_length.py), whose members hold every round's timed iterations in order, or a
benchmarks/measure_noise.py recording (each GPU-timed setting's batches, every call's, stand for its rounds); ``files``
(a list) reads several (each file's members apart). ``measure`` says what of them:

  level        member ``member`` (a name of the recording's pair, e.g. none) of op ``op``: its round values at
               ``window_ms`` after ``skip_ms`` against its own at ``against_skip_ms``, paired by round: ratio
               lo hi rounds (stats.rounds.log_ratio_interval)
  spread       max / min - 1 of each member's round values (every op's) at each of ``window_ms`` (a list)
               after ``skip_ms``: min max (over members and windows)
  bins         each member's mean iteration time in its first ``n_bins`` bins of ``bin_ms`` against its first
               bin (stats.window.bin_profile): within (the largest |x| over the bins other than the first and
               ``apart``), apart_lo apart_hi (least and largest over the members in the ``apart`` bins)
  steps        a round's largest step between consecutive ``bin_ms`` bins' medians (stats.window.largest_step):
               median_lo median_hi (least and largest over the members of the median over its rounds), max
  first_member what round 0 adds to the pair's log ratio, its first member (the pair's first) against the
               second, at ``window_ms`` (stats.window.first_member_effect): effect (mean over the op
               sessions of ``files``), n

``first_member`` (a kind): over every session of the runs ``runs`` (folders under results/) whose session.json
records its order, the member that ran first in round 0 against each other member with round 0 and at least
two later rounds in common (stats.window.first_member_effect): effect (mean over the pairs), se, pairs; with
``canary: true`` only the sessions that measured a drift canary first, ``false`` only those that did not.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from tptune.records.sessions import load_session
from tptune.stats.rounds import paired_ratio, point_rounds
from tptune.stats.window import (bin_profile, call_batches, first_member_effect, largest_step, round_values,
                                 spread)


def _members(rec: dict, where: str) -> dict[str, dict[str, dict]]:
    """{op: {member: {rounds, min_iters, ...}}} of a calibration recording (either layout) or of a
    benchmarks/measure_noise.py recording (calls: each setting's batches, every call's, stand for rounds)."""
    if "ops" in rec:
        return {op: o["members"] for op, o in rec["ops"].items()}
    if "members" in rec:
        return rec["members"]
    if "calls" in rec:
        out: dict[str, dict[str, dict]] = {}
        for key, calls in rec["calls"].items():
            op, _, mode = key.partition("/")
            if mode.partition(":")[0] != "gpu":      # events-timed calls hold no batch's GPU iterations
                continue
            rounds = [b for c in calls if c.get("iterations_ms") for b in call_batches(c)]
            if rounds:
                out.setdefault(op, {})[f"{op}-{mode}"] = {"rounds": rounds, "min_iters": 1}
        return out
    raise ValueError(f"{where}: no recorded members (ops.<op>.members, members.<op> or calls)")


def _recordings(results: Path, d: dict) -> dict[str, dict[str, dict]]:
    """The members of ``file`` or, for ``files``, of every one (a member named by file and setting)."""
    files = d["files"] if "files" in d else [d["file"]]
    out: dict[str, dict[str, dict]] = {}
    for f in files:
        for op, members in _members(json.loads((results / f).read_text()), f).items():
            out.setdefault(op, {}).update({(f"{f}:{m}" if "files" in d else m): r for m, r in members.items()})
    return out


def _member(members: dict[str, dict], name: str, where: str) -> dict:
    found = [m for cid, m in members.items() if cid.rsplit("-", 1)[-1] == name]
    if len(found) != 1:
        raise ValueError(f"{where}: no member {name!r} among {', '.join(members)}")
    return found[0]


def _level(ops: dict, d: dict, where: str) -> dict:
    m = _member(ops[d["op"]], d["member"], where)
    mine = round_values(m["rounds"], d["window_ms"], m["min_iters"], d.get("skip_ms", 0.0))
    theirs = round_values(m["rounds"], d["window_ms"], m["min_iters"], d["against_skip_ms"])
    r = paired_ratio(dict(enumerate(mine)), dict(enumerate(theirs)))
    return {"ratio": r.ratio, "lo": r.lo, "hi": r.hi, "rounds": r.rounds}


def _spread(ops: dict, d: dict) -> dict:
    ws = d["window_ms"] if isinstance(d["window_ms"], list) else [d["window_ms"]]
    s = [spread(round_values(m["rounds"], w, m["min_iters"], d.get("skip_ms", 0.0)))
         for members in ops.values() for m in members.values() for w in ws]
    return {"min": min(s), "max": max(s)}


def _bins(ops: dict, d: dict) -> dict:
    apart = set(d.get("apart", []))
    profiles = [bin_profile(m["rounds"], d["bin_ms"], d["n_bins"]) for members in ops.values()
                for m in members.values()]
    rest = [abs(x) for p in profiles for k, x in enumerate(p) if k and k not in apart]
    inside = [x for p in profiles for k, x in enumerate(p) if k in apart]
    return {"within": max(rest), "apart_lo": min(inside) if inside else None,
            "apart_hi": max(inside) if inside else None}


def _steps(ops: dict, d: dict) -> dict:
    per_member = []
    for members in ops.values():
        for m in members.values():
            steps = [s for s in (largest_step(r, d["bin_ms"]) for r in m["rounds"]) if s is not None]
            per_member.append(steps)
    medians = [statistics.median(s) for s in per_member if s]
    return {"median_lo": min(medians), "median_hi": max(medians), "max": max(max(s) for s in per_member if s)}


def _first_member_calibrations(results: Path, d: dict) -> dict:
    effects = []
    for f in d["files"]:
        rec = json.loads((results / f).read_text())
        for members in _members(rec, f).values():
            (_, a), (_, b) = list(members.items())[:2]      # the pair's order: round 0 ran its first first
            va, vb = (round_values(m["rounds"], d["window_ms"], m["min_iters"]) for m in (a, b))
            e = first_member_effect(dict(enumerate(va)), dict(enumerate(vb)))
            if e is not None:
                effects.append(e)
    if not effects:
        raise ValueError("no op session with round 0 and two later rounds")
    return {"effect": statistics.fmean(effects), "n": len(effects)}


def window_figure(results: Path, d: dict) -> dict:
    """The fields of a ``window`` figure (module doc)."""
    measure = d["measure"]
    if measure == "first_member":
        return _first_member_calibrations(results, d)
    ops = _recordings(results, d)
    if measure == "level":
        return _level(ops, d, d["file"])
    if measure == "spread":
        return _spread(ops, d)
    if measure == "bins":
        return _bins(ops, d)
    if measure == "steps":
        return _steps(ops, d)
    raise ValueError(f"measure {measure!r} is none of level, spread, bins, steps, first_member")


def first_member_figure(results: Path, d: dict) -> dict:
    """The fields of a ``first_member`` figure (module doc)."""
    want = d.get("canary")
    effects = []
    for run in d["runs"]:
        folder = results / run
        if not folder.is_dir():
            raise ValueError(f"runs: no folder {run!r} under results/")
        for sj in sorted(folder.rglob("session.json")):
            s = load_session(sj.parent, strict=False)
            order = s.record.get("order")
            if not order or (want is not None and bool(s.record.get("canary")) != want):
                continue
            first = order[0][0]
            mine = point_rounds(s.points.get(first))
            for cid, p in s.points.items():
                e = None if cid == first else first_member_effect(mine, point_rounds(p))
                if e is not None:
                    effects.append(e)
    if len(effects) < 2:
        raise ValueError(f"{len(effects)} pairs of round 0's first member with another: no mean and se")
    return {"effect": statistics.fmean(effects), "se": statistics.stdev(effects) / math.sqrt(len(effects)),
            "pairs": len(effects)}

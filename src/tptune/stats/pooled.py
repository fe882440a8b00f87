"""One pair measured in several sessions: the pooled ratio, each session a block.

Rounds pair a with b only inside a session. Pooled over sessions s = 1..k with n_s rounds each, the
per-round log ratios d_{s,r} give the estimate exp(mean of all d) (every round weighs alike) and a 95%
interval from the within-session spread (session as a block: each session's own level is taken out,
sd_w^2 = sum (d_{s,r} - mean_s)^2 / (n - k)), exp(mean +- t_{n-k} sd_w / sqrt(n)). With one session this is
the session's own paired interval. ``spread`` says how far the session means lie apart: when they differ
by more than their rounds explain (the largest |mean_s - mean| above t sd_w / sqrt(n_s)), ``heterogeneous``
is set and a report says so beside the figure.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tptune.records.sessions import read_point
from tptune.stats.rounds import log_ratio_interval, paired_log_ratios, point_rounds, t975


@dataclass
class Pooled:
    ratio: float
    lo: float | None
    hi: float | None
    rounds: int
    sessions: list = field(default_factory=list)   # [{"session", "ratio", "lo", "hi", "rounds"}]
    heterogeneous: bool = False

    def to_dict(self) -> dict:
        r = lambda x: None if x is None or not math.isfinite(x) else round(x, 5)   # noqa: E731
        return {"ratio": r(self.ratio), "lo": r(self.lo), "hi": r(self.hi), "rounds": self.rounds,
                "paired": True, "pooled_sessions": len(self.sessions), "heterogeneous": self.heterogeneous,
                "sessions": self.sessions}


def pooled_ratio(blocks: list[tuple[str, dict[int, float], dict[int, float]]]) -> Pooled | None:
    """[(session name, a's {round: ms}, b's {round: ms})] -> the pooled a/b; None without a round."""
    per = [(name, paired_log_ratios(a, b)) for name, a, b in blocks]
    per = [(name, ds) for name, ds in per if ds]
    if not per:
        return None
    alld = [x for _, ds in per for x in ds]
    n, k = len(alld), len(per)
    mean = statistics.fmean(alld)
    sessions = []
    for name, ds in per:
        r = log_ratio_interval(ds)
        sessions.append({"session": name, **r.to_dict()})
    if n - k < 1:
        return Pooled(math.exp(mean), None, None, n, sessions)
    ss = sum((x - statistics.fmean(ds)) ** 2 for _, ds in per for x in ds)
    sd = math.sqrt(ss / (n - k))
    half = t975(n - k) * sd / math.sqrt(n)
    het = k > 1 and any(abs(statistics.fmean(ds) - mean) > t975(n - k) * sd / math.sqrt(len(ds)) for _, ds in per)
    return Pooled(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, sessions, het)


def session_blocks(session_dirs: list[tuple[str, Path, str, str]]) -> list[tuple[str, dict, dict]]:
    """[(name, session folder, a's case, b's case)] -> pooled_ratio's blocks, read from run.json files
    (a session that lacks either case is skipped)."""
    out = []
    for name, d, a, b in session_dirs:
        sj = Path(d) / "session.json"
        if not sj.exists():
            continue
        runs = json.loads(sj.read_text())["runs"]
        if a not in runs or b not in runs:
            continue
        out.append((name, point_rounds(read_point(Path(d) / runs[a])), point_rounds(read_point(Path(d) / runs[b]))))
    return out


def run_pairs(run_dir: Path, a: str, b: str, under: str = "sessions") -> list[tuple[str, dict, dict]]:
    """Every session of a run that measured both ``a`` and ``b`` (search steps, TP points, the block)."""
    run_dir = Path(run_dir)
    return session_blocks([(str(sj.parent.relative_to(run_dir / under)), sj.parent, a, b)
                           for sj in sorted((run_dir / under).glob("**/session.json"))])


POOLED_WITH = "pooled_with.json"


def _same_cfgs(a: Path, b: Path) -> bool | None:
    """Whether two ub_cfgs YAML files hold the same settings (comments aside); None when one is missing."""
    import yaml

    if not (a.exists() and b.exists()):
        return None
    return yaml.safe_load(a.read_text()) == yaml.safe_load(b.read_text())


def block_pooled(run_dir: Path, layer_rec: dict) -> dict:
    """The block's tuned / each reference pooled over this run's block session and the sessions named in
    ``pooled_with.json`` (other runs of the same config, ``tptune verify`` of this run's file):
    ``[{"session": folder, "tuned": the file's case there, "file": its preset yaml (optional)}]``. A
    session whose file differs from this run's tuned preset is left out and named."""
    run_dir = Path(run_dir)
    spec = run_dir / POOLED_WITH
    if not spec.exists():
        return {}
    tp, tuned = layer_rec["tp"], layer_rec["tuned"]
    own = run_dir / "sessions" / "layer" / f"tp{tp}"
    mine = run_dir / "presets" / f"{tuned.split('ub.', 1)[-1]}.yaml"
    others, skipped = [], []
    for o in json.loads(spec.read_text()):
        if o.get("tp", tp) != tp:
            continue
        same = _same_cfgs(mine, (run_dir / o["file"])) if o.get("file") else None
        if same is False:
            skipped.append({"session": o["session"], "why": "another file"})
            continue
        others.append((o["session"], run_dir / o["session"], o["tuned"], same))
    out = {}
    for row in layer_rec["settings"]:
        ref = row["case"]
        if ref == tuned:
            continue
        blocks = session_blocks([("this run", own, tuned, ref)] +
                                [(name, d, t, ref) for name, d, t, _ in others])
        if len(blocks) > 1:
            p = pooled_ratio(blocks)
            if p is not None:
                out[row["variant"]] = p.to_dict()
    return {"pooled": out, "sessions": ["this run"] + [n for n, *_ in others],
            "checked_same_file": {n: s for n, _, _, s in others}, "skipped": skipped}

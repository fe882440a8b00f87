"""The ``stopping_replay`` figure kind (report.quoted_figures): what the futility stop saves over the
committed sessions (stats.stopping_replay, which benchmarks/replay_stopping.py prints): sessions, exact,
off and on (member-rounds without and with it), saved (1 - on / off), compared, changed (comparisons whose
outcome differs) and leader_changed; ``runs:`` (folders under results/) narrows it.
"""
from __future__ import annotations

import functools
from pathlib import Path

from tptune.report.figure_bound import run_roots
from tptune.stats.stopping_replay import replay_sessions


def stopping_figure(results: Path, d: dict) -> dict:
    """The fields of a ``stopping_replay`` figure (module doc)."""
    return dict(_replayed(Path(results), tuple(d.get("runs") or ())))


@functools.lru_cache(maxsize=8)     # several figures quote one replay of the same tree
def _replayed(results: Path, runs: tuple[str, ...]) -> dict:
    roots = run_roots(results, list(runs))
    r = replay_sessions(sorted({p.parent for root in roots for p in root.rglob("session.json")}))
    return {"sessions": r["sessions"], "exact": r["exact"], "off": r["member_rounds"]["off"],
            "on": r["member_rounds"]["on"], "saved": r["saved"], "compared": r["compared"],
            "changed": sum(r["changes"].values()), "leader_changed": r["leader_changed"]}

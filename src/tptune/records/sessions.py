"""Where a run's sessions live and how their records are read: sessions/<op>/tp<N>/<name>/session.json
and each member's run.json."""
from __future__ import annotations

import json
from pathlib import Path


def read_point(run_json: str | Path) -> dict:
    return json.loads(Path(run_json).read_text())


def session_dir(run_dir: Path, op: str, tp: int, name: str) -> Path:
    """Where a session's members and session.json live: sessions/<op>/tp<N>/<dim>/step<k> or .../point."""
    return Path(run_dir) / "sessions" / op / f"tp{tp}" / name


def read_session(run_dir: Path, rel: str) -> tuple[dict, dict[str, dict]]:
    """(session.json, {case id: its run.json}) of a recorded session."""
    d = Path(run_dir) / rel
    sess = json.loads((d / "session.json").read_text())
    return sess, {cid: read_point(d / p) for cid, p in sess["runs"].items()}


def step_session_name(dim_name: str, step: int) -> str:
    return f"{dim_name}/step{step}"

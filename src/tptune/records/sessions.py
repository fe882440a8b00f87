"""The recorded sessions, read once at the edge: a session's session.json and each member's run.json
(sessions/<op>/tp<N>/<name>/, RunDir names the folders). Everything above takes these values."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tptune.records.measured_point import MeasuredPoint
from tptune.records.preset_identity import file_identity
from tptune.records.run_dir import SESSION_JSON, RunDir


@dataclass(frozen=True)
class Session:
    """One recorded session: ``record`` is its session.json, ``points`` each member's run.json by case id
    (a measured point); ``unreadable``: members whose run.json is missing or unreadable."""
    name: str                      # relative to sessions/: "qkv/tp2/point", "qkv/tp2/chunks/step0", "layer/tp2"
    record: dict
    points: dict[str, MeasuredPoint]
    unreadable: tuple[str, ...] = field(default=())

    @property
    def op(self) -> str:
        """The op measured ("layer" for the block)."""
        return self.name.split("/")[0]

    @property
    def complete(self) -> bool:
        return not self.unreadable


def named(sessions: list[Session], name: str) -> Session | None:
    """The session called ``name`` (relative to sessions/) among ``sessions``, or None."""
    return next((x for x in sessions if x.name == name), None)


def read_point(run_json: str | Path) -> MeasuredPoint:
    """The point a member's run.json records (errors.RecordError naming the file when malformed)."""
    return MeasuredPoint.from_dict(json.loads(Path(run_json).read_text()), str(run_json))


def load_session(folder: str | Path, name: str = "", *, strict: bool = True) -> Session:
    """The session recorded in ``folder``; ``strict``: a member's missing run.json raises, else it is
    listed in ``unreadable``."""
    folder = Path(folder)
    rec = json.loads((folder / SESSION_JSON).read_text())
    points, unreadable = {}, []
    for cid, p in (rec.get("runs") or {}).items():
        try:
            points[cid] = read_point(folder / p)
        except (OSError, ValueError):
            if strict:
                raise
            unreadable.append(cid)
    return Session(name or folder.name, rec, points, tuple(unreadable))


def load_sessions(run: RunDir) -> list[Session]:
    """Every session the run recorded, in path order; one whose session.json cannot be read (being
    written) is left out."""
    out = []
    for sj in run.session_jsons():
        try:
            out.append(load_session(sj.parent, run.session_name(sj.parent), strict=False))
        except (OSError, ValueError, KeyError):
            continue
    return out


def session_records(run: RunDir) -> list[dict]:
    """Every session.json of the run, in path order (without the members' run.json)."""
    return [json.loads(p.read_text()) for p in run.session_jsons()]


def recorded_gpu_memory(run: RunDir) -> float | None:
    """The GPU memory (GiB) recorded by the run's first TP-point member, or None."""
    for p in run.point_run_jsons()[:1]:
        return read_point(p).gpu_memory_gib
    return None


@dataclass(frozen=True)
class PooledWith:
    """A session named in the run's pooled_with.json (another run of the same config, ``tptune verify`` of
    this run's file) that measured the block's pair: ``tuned`` is the file's case there, ``same_file``
    whether its preset yaml holds this run's tuned settings (None: no file named, or one missing)."""
    name: str
    session: Session | None        # None: no session.json there
    tuned: str
    same_file: bool | None


def _same_cfgs(a: Path, b: Path) -> bool | None:
    """Whether two ub_cfgs YAML files hold the same settings (records.preset_identity: a copy ``tptune
    verify`` wrote with true/false is the run's file); None when one is missing."""
    if not (a.exists() and b.exists()):
        return None
    return file_identity(a) == file_identity(b)


def load_pooled_with(run: RunDir, tp: int, tuned: str) -> tuple[list[PooledWith], list[dict]] | None:
    """(the sessions pooled_with.json names for the block at ``tp``, those left out because their file
    differs from this run's tuned preset: [{"session", "why"}]); None when the run names none."""
    if not run.pooled_with_json.exists():
        return None
    mine = run.preset_yaml(tuned.split("ub.", 1)[-1])
    others, skipped = [], []
    for o in json.loads(run.pooled_with_json.read_text()):
        if o.get("tp", tp) != tp:
            continue
        same = _same_cfgs(mine, run.file(o["file"])) if o.get("file") else None
        if same is False:
            skipped.append({"session": o["session"], "why": "another file"})
            continue
        folder = run.file(o["session"])
        session = load_session(folder, o["session"], strict=False) if (folder / SESSION_JSON).exists() else None
        others.append(PooledWith(o["session"], session, o["tuned"], same))
    return others, skipped

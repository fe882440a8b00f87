"""The recorded sessions, read once at the edge: a session's session.json and each member's run.json
(sessions/<op>/tp<N>/<name>/, RunDir names the folders). Everything above takes these values."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tptune.cases import CaseIdError, parse_case_id
from tptune.errors import RecordError
from tptune.records.load import read_json
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
    return MeasuredPoint.from_dict(read_json(run_json), str(run_json))


def read_session_record(folder: str | Path) -> dict:
    """A session's session.json, checked where the members are found (errors.RecordError naming the file and
    the field): a mapping; ``runs`` each member's run.json inside the folder; ``tp`` a TP size."""
    path = Path(folder) / SESSION_JSON
    rec = read_json(path)
    if not isinstance(rec, dict):
        raise RecordError(f"{path}: expected a session record (a mapping with session, tp, runs), "
                          f"got {type(rec).__name__}")
    if rec.get("session") is not None and not isinstance(rec["session"], str):
        raise RecordError(f"{path}: field 'session': expected a session name, got {rec['session']!r:.60}")
    tp = rec.get("tp")
    if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
        raise RecordError(f"{path}: field 'tp': expected a TP size (a whole number, at least 1), got {tp!r:.60}")
    runs = rec.get("runs")
    if runs is not None and not isinstance(runs, dict):
        raise RecordError(f"{path}: field 'runs': expected a mapping of case id to its run.json, got {runs!r:.60}")
    for cid, p in (runs or {}).items():
        rel = PurePosixPath(p) if isinstance(p, str) else None
        if rel is None or not p or rel.is_absolute() or ".." in rel.parts:
            raise RecordError(f"{path}: field 'runs.{cid}': {p!r:.60}: expected a member's run.json inside the "
                              "session folder (a relative path)")
    return rec


def read_member(folder: Path, rec: dict, cid: str, rel: str) -> MeasuredPoint:
    """Member ``cid`` of the session recorded as ``rec`` in ``folder``: its run.json, which must be that
    member of that session (its case, TP and session those session.json names)."""
    path = folder / rel
    pt = read_point(path)
    if pt.case != cid:
        raise RecordError(f"{path}: field 'case': {pt.case!r}, but session.json lists this member as {cid!r}")
    tp = rec.get("tp")
    if tp is not None:
        if pt.other.get("tp") is not None and pt.other["tp"] != tp:
            raise RecordError(f"{path}: field 'tp': {pt.other['tp']!r}, but the session measures TP {tp} "
                              f"({folder / SESSION_JSON})")
        try:
            case_tp = parse_case_id(cid).tp
        except CaseIdError:
            case_tp = tp
        if case_tp != tp:
            raise RecordError(f"{folder / SESSION_JSON}: field 'runs': member {cid!r} is at TP {case_tp}, but the "
                              f"session measures TP {tp}")
    if pt.session is not None and rec.get("session") is not None and pt.session != rec["session"]:
        raise RecordError(f"{path}: field 'session': {pt.session!r}, but the session is {rec['session']!r} "
                          f"({folder / SESSION_JSON})")
    return pt


def load_session(folder: str | Path, name: str = "", *, strict: bool = True) -> Session:
    """The session recorded in ``folder``; ``strict``: a member's missing or malformed run.json raises, else
    it is listed in ``unreadable``. A malformed session.json raises (errors.RecordError, a ValueError)."""
    folder = Path(folder)
    rec = read_session_record(folder)
    points, unreadable = {}, []
    for cid, p in (rec.get("runs") or {}).items():
        try:
            points[cid] = read_member(folder, rec, cid, p)
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
    return [read_session_record(p.parent) for p in run.session_jsons()]


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
    for o in read_json(run.pooled_with_json):
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

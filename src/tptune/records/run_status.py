"""What failed in a run, from its recorded sessions: the report's Failures section and its top line, the
check that ends a run non-zero when a stage has no successful member (``tptune check-run``), and what
``snakemake -R`` needs to re-measure failed sessions (``tptune failed``)."""
from __future__ import annotations

from pathlib import Path

from tptune.cases import REFERENCE_KINDS, parse_case_id
from tptune.errors import TptuneError
from tptune.records.run_dir import SESSION_JSON, RunDir
from tptune.records.sessions import Session, load_sessions


def check_run_dir(path: str | Path) -> RunDir:
    """A run folder (outputs/<run>: config.json and sessions/), or a clear error."""
    run = RunDir(path)
    if not run.root.is_dir():
        raise TptuneError(f"{run}: no such folder (a run is outputs/<run>)")
    if not run.config_json.exists() or not run.sessions.is_dir():
        raise TptuneError(f"{run}: not a run folder (a run's folder holds config.json and sessions/: "
                          "outputs/<run>)")
    return run


def stage_name(rel: str) -> str:
    """A session's stage in words: "layer stage at TP=2", "qkv TP=2 search chunks step 0", "fc2 TP=2 point"."""
    parts = rel.split("/")
    if parts[0] == "layer":
        packed = f" on packed micro-batches of T={parts[2][4:]}" if len(parts) == 3 else ""
        return f"layer stage at TP={parts[1][2:]}{packed}"
    op, tp, *rest = parts
    if rest == ["point"]:
        return f"{op} TP={tp[2:]} TP point"
    return f"{op} TP={tp[2:]} search {rest[0]} step {rest[1][4:]}"


def measuring_output(run: RunDir, rel: str) -> Path:
    """The output of the job that measures session ``rel`` (sessions/<rel>): snakemake -R on it
    re-measures the session and re-derives what follows. The layer stage's job writes layer/tp<N>.json (a packed
    block session, layer/tp<N>/pack<T>, its session.json)."""
    parts = rel.split("/")
    if parts[0] == "layer" and len(parts) == 2:
        return run.layer_json(parts[1][2:])
    return run.sessions / rel / SESSION_JSON


def _reason(err: dict | None) -> str:
    err = err or {}
    return f"{err.get('kind', '?')}: {' '.join(str(err.get('message', '')).split())[:400]}"


def run_failures(sessions: list[Session]) -> dict:
    """{"members": every failed member, "retried": every failed attempt that was tried again, "stages":
    every session none of whose members was measured}, each with its session, case and reason, of the
    run's recorded ``sessions`` (records.sessions.load_sessions)."""
    members, retried, stages = [], [], []
    for recorded in sessions:
        sess, rel = recorded.record, recorded.name
        ok_ids, failed_ids = [], []
        for cid in sess.get("runs", {}):
            run = recorded.points.get(cid)
            if run is None:
                members.append({"session": rel, "case": cid, "reason": "run.json missing or unreadable"})
                failed_ids.append(cid)
                continue
            if run.status == "ok":
                ok_ids.append(cid)
            else:
                members.append({"session": rel, "case": cid, "reason": _reason(run.error)})
                failed_ids.append(cid)
            for i, a in enumerate(run.attempts[:-1]):
                if a.get("status") != "ok":
                    retried.append({"session": rel, "case": cid, "attempt": i + 1, "reason": _reason(a.get("error"))})
        reasons = "; ".join(sorted({m["reason"] for m in members if m["session"] == rel}))[:600]
        headline = _uncompared(rel, sess, ok_ids, failed_ids)
        if headline:
            stages.append({"session": rel, "stage": stage_name(rel), "members": len(sess.get("members") or []),
                           "headline": headline, "reason": reasons})
    return {"members": members, "retried": retried, "stages": stages}


def _kind(case_id: str) -> str | None:
    try:
        return parse_case_id(case_id).variant.kind
    except ValueError:
        return None


def _uncompared(rel: str, sess: dict, ok: list[str], failed: list[str]) -> str | None:
    """Why a session compared nothing, or None when it compared something: no member measured; at a TP
    point, no overlapped setting measured (the TP decision stops there, decide.tp.unmeasured) or a
    reference failed (no overlap or the bound: the TP rule and the op's pick judge against them); on the
    block, only the tuned combination measured (what it is judged against failed)."""
    if not sess.get("members"):
        return None
    if not ok:
        return f"none of its {len(sess['members'])} settings was measured"
    if rel.endswith("/point"):
        overlapped = [c for c in ok + failed if _kind(c) not in REFERENCE_KINDS]
        if overlapped and not set(overlapped) & set(ok):
            return f"none of its {len(overlapped)} overlapped settings was measured"
        refs = [c for c in failed if _kind(c) in REFERENCE_KINDS]
        if refs:
            return f"nothing was compared against {' and '.join(refs)}, which failed"
    if rel.startswith("layer/"):
        always = set((sess.get("settings") or {}).get("always") or [])
        if always and set(ok) <= always and failed:
            return (f"nothing was compared: {', '.join(sorted(failed))} failed, and the tuned combination "
                    "was measured alone")
    return None


def failed_outputs(path: str | Path) -> list[Path]:
    """The measuring outputs of every session with a failed member (a setting is re-measured with the
    settings it is compared to, never alone)."""
    run = check_run_dir(path)
    rels = dict.fromkeys(m["session"] for m in run_failures(load_sessions(run))["members"])
    return [measuring_output(run, rel) for rel in rels]

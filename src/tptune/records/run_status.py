"""What failed in a run, from its recorded sessions: the report's Failures section and its top line, the
check that ends a run non-zero when a stage has no successful member (``tptune check-run``), and what
``snakemake -R`` needs to re-measure failed sessions (``tptune failed``)."""
from __future__ import annotations

import json
from pathlib import Path

from tptune.cases import REFERENCE_KINDS, parse_case_id
from tptune.errors import TptuneError


def check_run_dir(run_dir: Path) -> Path:
    """A run folder (outputs/<run>: config.json and sessions/), or a clear error."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TptuneError(f"{run_dir}: no such folder (a run is outputs/<run>)")
    if not (run_dir / "config.json").exists() or not (run_dir / "sessions").is_dir():
        raise TptuneError(f"{run_dir}: not a run folder (a run's folder holds config.json and sessions/: "
                          "outputs/<run>)")
    return run_dir


def session_jsons(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("sessions/**/session.json"))


def stage_name(rel: str) -> str:
    """A session's stage in words: "layer stage at TP=2", "qkv TP=2 search chunks step 0", "fc2 TP=2 point"."""
    parts = rel.split("/")
    if parts[0] == "layer":
        return f"layer stage at TP={parts[1][2:]}"
    op, tp, *rest = parts
    if rest == ["point"]:
        return f"{op} TP={tp[2:]} TP point"
    return f"{op} TP={tp[2:]} search {rest[0]} step {rest[1][4:]}"


def measuring_output(run_dir: Path, rel: str) -> Path:
    """The output of the job that measures session ``rel`` (sessions/<rel>): snakemake -R on it
    re-measures the session and re-derives what follows. The layer stage's job writes layer/tp<N>.json."""
    parts = rel.split("/")
    if parts[0] == "layer":
        return Path(run_dir) / "layer" / f"{parts[1]}.json"
    return Path(run_dir) / "sessions" / rel / "session.json"


def _reason(err: dict | None) -> str:
    err = err or {}
    return f"{err.get('kind', '?')}: {' '.join(str(err.get('message', '')).split())[:400]}"


def run_failures(run_dir: Path) -> dict:
    """{"members": every failed member, "retried": every failed attempt that was tried again, "stages":
    every session none of whose members was measured}, each with its session, case and reason."""
    run_dir = Path(run_dir)
    members, retried, stages = [], [], []
    for sj in session_jsons(run_dir):
        sess = json.loads(sj.read_text())
        rel = str(sj.parent.relative_to(run_dir / "sessions"))
        ok_ids, failed_ids = [], []
        for cid, p in sess.get("runs", {}).items():
            try:
                run = json.loads((sj.parent / p).read_text())
            except (OSError, ValueError):
                members.append({"session": rel, "case": cid, "reason": "run.json missing or unreadable"})
                failed_ids.append(cid)
                continue
            if run.get("status") == "ok":
                ok_ids.append(cid)
            else:
                members.append({"session": rel, "case": cid, "reason": _reason(run.get("error"))})
                failed_ids.append(cid)
            attempts = run.get("attempts") or []
            for i, a in enumerate(attempts[:-1]):
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


def failed_outputs(run_dir: Path) -> list[Path]:
    """The measuring outputs of every session with a failed member (a setting is re-measured with the
    settings it is compared to, never alone)."""
    run_dir = check_run_dir(run_dir)
    rels = dict.fromkeys(m["session"] for m in run_failures(run_dir)["members"])
    return [measuring_output(run_dir, rel) for rel in rels]

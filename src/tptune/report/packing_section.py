"""The report's answer on packed micro-batches (issue 53, docs/packing.md; templates/packing.md.j2), from
packing.json when it exists: its one sentence on the first screen, in the answer card before the model TP, and a
section of its own after the card (the per-T table, the padding against the overlap, the native fit, memory, what
each framework needs)."""
from __future__ import annotations

import json
import math

import jinja2

from tptune.emit.packing import TITLES
from tptune.records.run_dir import RunDir
from tptune.report.sections import insert

HEADLINE_BEFORE = "\n**Model TP:"    # the answer card's paragraph the sentence goes before
RULES = {"verl": "veRL", "slime": "slime", "fill": "Megatron-RL"}


def read(run: RunDir) -> dict | None:
    if not run.packing_json.is_file():
        return None
    return json.loads(run.packing_json.read_text())


def _pct(x) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _ratio(r: dict | None, words: bool = False) -> str:
    if not r or r.get("ratio") is None:
        return "–"
    iv = (f" [{r['lo']:.3f}, {r['hi']:.3f}]" if r.get("lo") is not None and r.get("hi") is not None
          and r.get("rounds", 0) >= 2 else " (one round: no interval)")
    return f"{r['ratio']:.3f}{iv}" + (f" ({r['words']})" if words and r.get("words") else "")


def _pct_iv(r: dict | None, saves: bool = False) -> str:
    """r - 1 (or 1 - r where ``saves``) as a percentage with its interval."""
    if not r or r.get("ratio") is None:
        return "–"
    f = (lambda x: 1 - x) if saves else (lambda x: x - 1)
    lo, hi = (r.get("hi"), r.get("lo")) if saves else (r.get("lo"), r.get("hi"))
    iv = f" [{_pct(f(lo))}, {_pct(f(hi))}]" if lo is not None and hi is not None and r.get("rounds", 0) >= 2 else ""
    return f"{_pct(f(r['ratio']))}{iv}"


def _rows(p: dict) -> list[dict]:
    by_cap = {c["capacity"]: c for c in (p.get("decision") or {}).get("capacities") or []}
    out = []
    for r in p.get("rows") or []:
        d, ratios = by_cap.get(r["capacity"], {}), r.get("ratios") or {}
        out.append({"capacity": r["capacity"], "bins": f"{r['bins_per_step']:.1f}" if "bins_per_step" in r else "–",
                    "padding": _pct(r.get("padding_share")), "set_none": _ratio(ratios.get("set/none"), True),
                    "fwd_only": _ratio(ratios.get("set/none forward-only")),
                    "padding_cost": _ratio(d.get("padding_cost")), "overlap": _ratio(d.get("overlap")),
                    "vs_native": _ratio(d.get("vs_native")), "preset_none": _ratio(ratios.get("preset/none")),
                    "ub": f"{r['ub_gib']:.2f} GiB" if r.get("ub_gib") is not None else "–",
                    "rounds": r.get("rounds", "–")})
    return out


def _memory(p: dict) -> str | None:
    m = p.get("memory") or {}
    cap = p.get("capacity")
    gib = (m.get("ub_gib") or {}).get(str(cap)) if cap else None
    if gib is None:
        return None
    left = m.get("headroom_bytes")
    fits = "" if left is None else (" It fits what the memory floor leaves." if m["ub_bytes"][str(cap)] <= left
                                    else " **It does not fit what the memory floor leaves.**")
    return (f"turning overlap on at T = {cap} adds {gib:.2f} GiB of userbuffers a GPU (TE's twelve communicators of "
            f"T x hidden, packing/ub_memory.py){'; ' + m['why'] if m.get('why') else ''}.{fits}")


def packing_section(env: jinja2.Environment, run: RunDir, num_layers: int, cpu: bool) -> str:
    """The section's markdown, or "" for a run without packing.json."""
    p = read(run)
    if p is None:
        return ""
    if p.get("capacity") is None:
        return f"## Packed micro-batches: does overlap pay after the padding?\n\n{p['sentence']}\n"
    rows = _rows(p)
    d = {c["capacity"]: c for c in (p.get("decision") or {}).get("capacities") or []}.get(p["capacity"])
    chosen = None
    if d is not None:
        chosen = {"capacity": p["capacity"], "padding": _pct(d.get("padding_share")),
                  "padding_cost_pct": _pct_iv(d.get("padding_cost")), "overlap_pct": _pct_iv(d.get("overlap"), True),
                  "vs_native": _ratio(d.get("vs_native"))}
    fit = (p.get("native") or {}).get("fit")
    if fit:
        fit = {**fit, "residual": _pct(fit.get("residual")), "outside": _pct(fit.get("outside"))}
    files = p.get("files") or {}
    fws = [{"title": TITLES.get(f["framework"], f["framework"]), "file": files.get(f["framework"], "–"),
            "ready": f.get("ready"), "needs": f.get("needs") or [], "option_problems": f.get("option_problems") or []}
           for f in p.get("frameworks") or []]
    return env.get_template("packing.md.j2").render(
        p=p, rows=rows, has_preset=any(r.get("preset") for r in p.get("rows") or []), chosen=chosen, fit=fit,
        native_padding=_pct((p.get("native") or {}).get("padding_share")),
        over_budget=_pct((p.get("native") or {}).get("over_budget_share")), memory=_memory(p), frameworks=fws,
        rule_name=RULES.get(p.get("rule"), p.get("rule")), num_layers=num_layers, cpu=cpu)


def packing_headline(run: RunDir) -> str:
    """The answer card's line (the report's first screen), "" without packing.json."""
    p = read(run)
    if p is None:
        return ""
    where = f"TP {p['tp']}, " if p.get("tp") else ""
    return (f"**Packed micro-batches** ({where}against {RULES.get(p.get('rule'), p.get('rule'))}'s own batching; "
            f"`packing.json`, section below): {p['sentence']}")


def with_packing_section(text: str, section: str, headline: str = "") -> str:
    """``text`` (report.md) with ``headline`` in the answer card, before its model TP, and ``section`` after the
    card (before "How it was measured")."""
    return insert(text, section, headline, HEADLINE_BEFORE)

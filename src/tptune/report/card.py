"""The report's first screen: what to load, the model TP and why, the block-level gain against the
references (pooled where several sessions measured the pair), the capped overlap efficiency, and one
line per reason to doubt it. Built from decisions.json and the recorded sessions only."""
from __future__ import annotations

import re
from pathlib import Path

from tptune.cases import CaseIdError, parse_case_id
from tptune.decide.file_sets import ALL_FILES
from tptune.model.ops import OPS
from tptune.stats.bound import burned_in
from tptune.stats.efficiency import Efficiency
from tptune.stats.wording import classify_ratio, not_a_figure
from tptune.stats.rounds import Ratio, ratio_of
from tptune.records.files import write_via_buffer
from tptune.records.layer_result import decided_layers
from tptune.records.measured_point import MeasuredPoint
from tptune.records.run_dir import RunDir, layer_session_name, point_session_name
from tptune.records.sessions import Session, named
from tptune.te.describe import and_join, describe_setting

# What a run writes for users to load, in the order a user reaches for them: decisions.json's key for the
# file (meta["files"]["sets"][tp]["files"]), its unsuffixed name (the copy of the default set), what loads it.
LOADABLE_FILES = tuple((key, ALL_FILES[key].format(""), why) for key, why in (
    ("ub_cfgs_yaml", "Megatron-LM `--tp-comm-overlap-cfg` (TE `ub_cfgs`)"),
    ("megatron_flags", "Megatron-LM command-line flags"),
    ("overrides", "Megatron-core `TransformerConfig` fields"),
    ("bridge", "Megatron-Bridge / NeMo 2 `TransformerLayerTPOverlapCfg`"),
    ("ub_cfgs_json", "TE `initialize_ub(ub_cfgs=...)`"),
    ("chunked_cfg", "the torch backend's chunk counts per GEMM shape (no framework loads it: docs/loading.md)")))
LOADABLE = tuple((name, why) for _, name, why in LOADABLE_FILES)
BLOCK = "block"
# tptune's own block combinations (decide.layer: tuned_preset, fastest_preset, other_mode_preset): measured
# beside the presets but never one of them
OWN_COMBINATIONS = re.compile(r"ub\.(tuned|fastest|tuned_other_dgrad)_tp\d+")
OWN_NAMES = {"tuned": "the tuned combination", "fastest": "tptune's fastest combination",
             "tuned_other_dgrad": "the tuned combination in the other dgrad mode"}


def _ratio(r: Ratio | None) -> dict | None:
    """A paired ratio as recorded (Ratio.to_dict); None without a finite estimate."""
    d = r.to_dict() if r is not None else None
    return d if d and d["ratio"] is not None else None


def evidence_tp(rec: dict) -> str:
    """The TP whose point session an op's figures come from: its chosen TP, or for TP 1 (no setting of
    its own) the smallest TP measured."""
    pts = rec.get("points", {"0": 0})   # none recorded: no TP, so no point session to read
    return str(rec["tp"]) if str(rec["tp"]) in pts else min(pts, key=int)


def _preset(variant: str) -> bool:
    """A named ub_cfgs preset of search.te_presets measured as a reference (not TE defaults, not one of
    tptune's own combinations)."""
    return (variant.startswith("ub.") and "+" not in variant and variant != "ub.te"
            and not OWN_COMBINATIONS.fullmatch(variant))


GRADED = {"proven": "proven on the block", "undecided": "undecided on the block", "unproven": "unproven",
          "failed": "**failed**",
          None: "not graded (decisions.json lists no files: the layout before tptune graded them)"}


def _file_set(tp: int, files: list[dict], rec: dict | None = None) -> dict:
    rec = rec or {}
    status = rec.get("status")
    return {"tp": tp, "files": files, "names": ", ".join(f"`{f['name']}`" for f in files), "status": status,
            "graded": GRADED.get(status, status), "why": rec.get("why"), "check": rec.get("check")}


def _files(meta: dict, run: RunDir, backend: str) -> dict:
    """What the card tells users to load: ``load``, the unsuffixed files (a copy of the default TP's set),
    and ``sets``, each TP's own files with how far they are proven (decisions.json meta["files"]). A run
    recorded before decisions.json listed its files: the unsuffixed files in the folder, except at model
    TP 1, where no file is to be loaded and the per-TP files in the folder are named instead."""
    rec = meta.get("files")
    if rec is not None:
        sets = []
        for key, s in sorted((rec.get("sets") or {}).items(), key=lambda kv: int(kv[0])):
            names = s.get("files") or {}
            sets.append(_file_set(int(s.get("tp", key)), [{"key": k, "name": names[k], "for": why}
                                                          for k, _, why in LOADABLE_FILES if k in names], s))
        default = next((x for x in sets if str(x["tp"]) == str(rec["default"])), None) \
            if rec.get("default") is not None else None
        keys = {f["key"] for f in default["files"]} if default else set()
        load = [{"name": name, "for": why} for k, name, why in LOADABLE_FILES if k in keys]
        return {"recorded": True, "model_tp": rec.get("model_tp", meta.get("model_tp")), "load": load,
                "default": default, "sets": sets, "others": [x for x in sets if x is not default]}
    # the torch backend measured chunk counts, never userbuffers: its per-TP yaml holds TE defaults
    per_tp = {int(m[1]): p.name for p in run.files("tp_comm_overlap_cfg.tp*.yaml")
              if (m := re.fullmatch(r"tp_comm_overlap_cfg\.tp(\d+)\.yaml", p.name)) and backend == "te"}
    sets = [_file_set(tp, [{"name": name, "for": LOADABLE_FILES[0][2]}]) for tp, name in sorted(per_tp.items())]
    load = [] if meta.get("model_tp") == 1 else \
        [{"name": n, "for": why} for n, why in LOADABLE if run.file(n).exists()
         and (n != "chunked_cfg.yaml" or backend == "torch")]
    return {"recorded": False, "model_tp": meta.get("model_tp"), "load": load, "default": None, "sets": sets,
            "others": sets if not load else []}


def _model_tp_reason(meta: dict) -> str:
    """The one rule that set the model TP, in words, from the TP decision's evidence."""
    tp, ev = meta.get("model_tp"), meta.get("model_tp_evidence") or []
    floor = _raised_floor(meta)
    undecided = next((e for e in ev if e.get("rule") == "hides_communication" and e.get("undecided")), None)
    if undecided:
        then = f"; memory floor: {floor.get('reason') or floor.get('why')}" if floor else ""
        return f"overlap rule at TP {undecided['tp']}: {undecided['reason']}{then}"
    if floor:
        unmeasured = f"; TP {floor['floor_tp']} was not measured in this run" if floor.get("measured") is False else ""
        return f"memory floor: {floor.get('reason') or floor.get('why')}{unmeasured}"
    for e in ev:
        if e.get("rule") == "hides_communication" and e.get("tp") == tp and e.get("passed"):
            return (f"overlap rule at TP {tp}: {e['reason']}; it needs {100 * e['min_hidden_fraction']:.0f}% "
                    "of the exposed communication hidden")
        if e.get("rule") == "scaling" and e.get("to_tp") == tp and e.get("passed"):
            return (f"overlap rule: TP {e['from_tp']} → {tp} takes the ops from "
                    f"{e['time_from_ms']:.3f} to {e['time_to_ms']:.3f} ms (needs ≤ {e['bound_ms']:.3f})")
    for e in ev:
        if e.get("passed"):
            continue
        if e.get("rule") == "hides_communication":
            return (f"overlap rule at TP {e['tp']}: {e['reason']}; it needs {100 * e['min_hidden_fraction']:.0f}% "
                    "of the exposed communication hidden")
        if e.get("rule") == "scaling":
            return (f"overlap rule: TP {e['from_tp']} → {e['to_tp']} would take the ops from "
                    f"{e['time_from_ms']:.3f} to {e['time_to_ms']:.3f} ms (needs ≤ {e['bound_ms']:.3f})")
        if e.get("rule") == "node_bound":
            return f"the node: TP {e['tp']} exceeds its {e['gpus_per_node']} GPUs or the TP sizes tried {e['allowed_tps']}"
    return "the only TP size that could be decided"


def _holds(case_id: str | None, run: RunDir) -> tuple[str | None, str | None]:
    """(what a block setting is called, its settings in words): tptune's own combinations by role, with their
    settings from the run's presets/; a named preset, TE's defaults or no overlap by name alone."""
    if not case_id:
        return None, None
    variant = parse_case_id(case_id).variant_id
    own = OWN_COMBINATIONS.fullmatch(variant)
    words = describe_setting(case_id, presets_dir=[run.presets])
    return (OWN_NAMES[own[1]], words) if own else (words, None)


def _ops_words(ops: dict[str, dict]) -> str:
    """The per-op settings in words, ops with the same setting at the same TP together, one sentence each (a
    setting's own parts are separated by semicolons): "qkv and fc1: ring exchange for every GEMM, reduce-scatter
    inside dgrad. proj and fc2: ring exchange for every GEMM"."""
    groups: dict[tuple, list[str]] = {}
    for op, o in ops.items():
        groups.setdefault((o["tp"], o["words"]), []).append(op)
    one_tp = len({tp for tp, _ in groups}) == 1
    return ". ".join(f"{and_join(names)}{'' if one_tp else f' at TP {tp}'}: {words}"
                     for (tp, words), names in groups.items())


def _op_words(config: dict, op: str) -> str:
    """An op's chosen setting in words (decisions.json's config: its variant and, for userbuffers, its entries);
    "no TP" and "not measured" as recorded."""
    variant = config.get("variant")
    try:
        return describe_setting(variant, op=op, ub_cfgs=config.get("ub_cfgs"))
    except (CaseIdError, ValueError):
        return str(variant)


def _block(meta: dict, margin: float, run: RunDir) -> dict | None:
    """The layer stage at the model TP: what the file holds and the tuned block against each
    reference, pooled over every session that measured the pair where the run has several."""
    rec = decided_layers(meta).get(str(meta.get("model_tp")))
    if rec is None:
        return None
    pooled = (rec.pooled or {}).get("pooled") or {}
    refs, presets, own = [], [], []
    for row in rec.settings:
        vs = row.get("tuned_vs") or {}
        if not vs:
            continue
        session_r = vs.get("ratio")
        p = pooled.get(row["variant"])
        r = p or session_r
        item = {"variant": row["variant"], "ratio": r, "pooled_sessions": (p or {}).get("pooled_sessions", 1),
                "session_ratio": session_r, "words": classify_ratio(r, margin) if r else "not measured",
                "status": row.get("status")}
        if _preset(row["variant"]):
            presets.append(item)
        elif row["variant"] in ("none", "ub.te"):
            refs.append(item)
        elif OWN_COMBINATIONS.fullmatch(row["variant"]):
            own.append(item)
    # the best preset is the one the tuned block gains least against (its ratio nearest or above 1)
    best = max(presets, key=lambda x: (x["ratio"] or {}).get("ratio") or 0.0) if presets else None
    # where the file holds another setting than the tuned one: it against each reference, this session only
    # (the pooled sessions measured the tuned combination)
    # held out (decide.held_out): each round scored by the file the block chooses without that round
    held = (rec.held_out or {}).get("vs") or {}
    file_rows = [{"variant": row["variant"], "ratio": row["file_vs"].get("ratio"), "words": row["file_vs"]["words"],
                  "tuned": row["case"] == rec.tuned, "held_out": held.get(row["variant"])}
                 for row in rec.settings if row.get("file_vs") and row["variant"] != "nocomm"
                 and row.get("status") in (None, "ok") and row.get("median_ms")]
    # where the block keeps the tuned combination but a round's choice without it would not have: the held-out
    # figures against the references the tuned table shows
    other_choice = None
    if rec.held_out and not rec.held_out.get("same") and not file_rows:
        shown = [r["variant"] for r in refs] + ([best["variant"]] if best else [])
        other_choice = {"rounds": [int(r) for r, c in rec.held_out["choices"].items() if c != rec.winner],
                        "chose": sorted({c for c in rec.held_out["choices"].values() if c != rec.winner} - {None}),
                        "rows": [{"variant": v, **held[v]} for v in shown if v in held]}
    unproven = sum((r.get("host_batches") or {}).get("failed", 0) for r in rec.settings)
    batches = sum((r.get("host_batches") or {}).get("batches", 0) for r in rec.settings)
    holds, holds_words = _holds(rec.winner, run)
    return {"tp": rec.tp, "winner": rec.winner, "tuned": rec.tuned, "reason": rec.reason,
            "holds": holds, "holds_words": holds_words,
            "numerics_failed": rec.numerics_failed, "references": refs, "best_preset": best, "own": own,
            "presets": presets, "rounds": rec.rounds, "host_failed": unproven, "host_batches": batches,
            "file_rows": file_rows, "held_out": rec.held_out is not None, "held_out_other": other_choice}


def _confidence(decisions: dict, s, failures: list[dict], block: dict | None) -> list[str]:
    meta = decisions["meta"]
    m = meta.get("measurement") or {}
    lines = []
    tied = {op: rec.get("ties") or [] for op, rec in decisions["ops"].items()}
    n_ties = sum(len(t) for t in tied.values())
    fin = {op: len(rec.get("finalists") or []) for op, rec in decisions["ops"].items() if rec.get("finalists")}
    # a member of an op's TP point that failed was compared with nothing: the pick did not beat it
    uncompared = [f["case"] for op, rec in decisions["ops"].items() for f in failures
                  if f["session"] == point_session_name(op, evidence_tp(rec))]
    not_compared = (f" Not compared with {', '.join(f'`{c}`' for c in uncompared)}, which failed (listed under "
                    "Failures)." if uncompared else "")
    if n_ties:
        lines.append(f"Ties: {n_ties} setting(s) within the noise of the pick "
                     f"({', '.join(f'{op} {len(t)}' for op, t in tied.items() if t)}); "
                     "a tie goes to the cheaper setting, and another run may pick any of them." + not_compared)
    elif uncompared or fin:
        lines.append("Ties: none among the settings compared." + not_compared)
    else:
        lines.append("Ties: none; every op's pick beats its other settings beyond the margin.")
    if fin:
        lines.append("Finalists (faster than the pick beyond the noise, within the margin; the block decided): "
                     + ", ".join(f"{op} {n}" for op, n in fin.items()) + ".")
    lines.append(f"Noise: {m['warning']}" if m.get("warning") else
                 "Noise: the round-to-round noise inside sessions stayed within what the round budget resolves.")
    faults = m.get("bound_faults") or []
    lines.append(f"Faults: {len(faults)} bound fault(s) (a no-communication bound measured slower than a setting "
                 "it bounds); their efficiencies are not shown." if faults else "Faults: no bound fault.")
    host = m.get("host_bound") or []
    behind = m.get("host_behind") or []
    if s.device != "cuda":
        lines.append("Host: on CPU the host is the device.")
    elif host or behind:
        lines.append(f"Host: {len(host)} host-bound setting(s) (host launch ≥ GPU time: in training the host must "
                     f"keep up with these); {len(behind)} setting(s) with a batch the host never got ahead of.")
    else:
        lines.append("Host: every op batch had the host ahead of the GPU (GPU time).")
    if block and block["host_failed"]:
        why = ""
        if s.model.model.is_moe and block["host_failed"] == block["host_batches"]:
            # Megatron-core's alltoall dispatcher copies the tokens per expert to the host and waits for the copy
            # (token_dispatcher.py, cuda_sync_point): results/knobs-mixtral-8x7b-h200x2, qwen3-30b-a3b-h200x4-tp4
            why = (" An MoE layer's token dispatch waits on the host for the tokens per expert once per pass, so the "
                   "host cannot run ahead of this block, and a training step is paced by its host the same way.")
        lines.append(f"Block host evidence: {block['host_failed']} of {block['host_batches']} block batches failed the "
                     f"host-ahead check; the block figures include host launch time.{why}")
    # every block measured, at the model TP or not: a setting that failed its numerics is a failure of the run
    wrong = [r["case"] for _, rec in sorted(decided_layers(meta).items(), key=lambda kv: int(kv[0]))
             for r in rec.settings if r.get("correct") is False]
    parts = ([f"{len(failures)} failed member(s), listed under Failures"] if failures else []) + \
        ([f"{len(wrong)} block setting(s) failed the numerics check ({', '.join(f'`{c}`' for c in wrong)}; see the "
          "block's numerics column)"] if wrong else [])
    lines.append(f"Failures: {'; '.join(parts)}." if parts else "Failures: none.")
    return lines


def _efficiency(decisions: dict) -> tuple[str | None, str | None]:
    """(the summed ops' capped efficiency as shown, or None; why none is shown). Only where some op's
    chosen setting overlaps is there a comparison: an op that chose no overlap hides nothing by definition."""
    eff = decisions["meta"].get("model_efficiency")
    overlapped = [op for op, rec in decisions["ops"].items()
                  if (w := (rec.get("winner") or {}).get("case")) and parse_case_id(w).variant_id != "none"]
    if not overlapped:
        return None, "every op's fastest setting was no overlap, so no overlap setting was compared with its bound"
    if not eff:
        return None, "not recorded"
    return Efficiency.from_dict(eff).shown(), None


def answer_card(s, run: RunDir, decisions: dict, failures: list[dict]) -> dict:
    meta = decisions["meta"]
    margin = meta.get("noise_floor") or s.decision.noise_floor
    files = _files(meta, run, s.backend)
    flags = None
    flags_file = run.file("megatron_flags.txt")
    if any(f["name"] == flags_file.name for f in files["load"]) and flags_file.exists():
        flags = " ".join(ln.strip() for ln in flags_file.read_text().splitlines()
                         if ln.strip() and not ln.lstrip().startswith("#"))
    efficiency, no_efficiency = _efficiency(decisions)
    block = _block(meta, margin, run)
    no_tp = meta.get("model_tp") == 1
    ops = {op: {"tp": rec["tp"], "variant": (rec.get("config") or {}).get("variant"),
                "words": _op_words(rec.get("config") or {}, op)} for op, rec in decisions["ops"].items()}
    tps = {o["tp"] for o in ops.values()}
    return {"no_tp": no_tp, "files": files, "load": files["load"], "flags": flags, "model_tp": meta.get("model_tp"),
            "tp_reason": _model_tp_reason(meta),
            # te's sets are files a framework loads; torch's chunk map is a record no framework loads
            # (docs/loading.md) and `tptune check` refuses: never one to "load" or "take"
            "loadable": s.backend == "te",
            "ops": ops, "ops_words": _ops_words(ops), "ops_tp": next(iter(tps)) if len(tps) == 1 else None,
            "ops_note": s.ops_note if s.ops_note and tuple(s.ops) != OPS else None,
            "block": block, "layer_tps": sorted(int(tp) for tp in decided_layers(meta)),
            "efficiency": efficiency, "no_efficiency": no_efficiency,
            "confidence": _confidence(decisions, s, failures, block), "cpu": s.device != "cuda",
            "margin": margin, "memory_no_fit": _memory_no_fit(meta),
            "rule_undecided": bool(meta.get("model_tp_undecided")), "unmeasured_tp": _unmeasured_tp(meta),
            "tp_sizes": list(s.tp_sizes)}


def _raised_floor(meta: dict) -> dict | None:
    """The memory floor's evidence where it raised the model TP (decide.tp.apply_floor), else None."""
    return next((e for e in meta.get("model_tp_evidence") or [] if e.get("rule") == "memory_floor"
                 and not e.get("passed")), None)


def _unmeasured_tp(meta: dict) -> int | None:
    """The model TP when the memory floor raised the answer to a TP this run did not measure (decide.tp.apply_floor
    records ``measured``): there is no setting or file for it."""
    floor = _raised_floor(meta)
    return meta.get("model_tp") if floor and floor.get("measured") is False else None


def _memory_no_fit(meta: dict) -> str | None:
    """The memory check's words when no layout it tried fits and so nothing raised the TP: the answer cannot
    then be "train without TP" (decide.tp.memory_floor)."""
    mem = meta.get("memory") or {}
    return mem.get("why") if mem.get("status") == "no_fit" and not mem.get("effective_tp") else None


def _point_ratios(points: dict[str, MeasuredPoint], none_id: str) -> dict[str, dict | None]:
    """Each member's time over no overlap's, paired by round (the bound after its burn-in round)."""
    none = points.get(none_id)
    out = {}
    for cid, p in points.items():
        if cid == none_id or none is None:
            continue
        q = burned_in(p) if cid.endswith("-nocomm") else p
        out[cid] = _ratio(ratio_of(q, none))
    return out


def summary_rows(sessions: list[Session], decisions: dict) -> list[dict]:
    """Per op at its chosen TP (its evidence TP for TP 1) and for the block at the model TP: no overlap,
    TE defaults, each preset, the tuned setting and the bound, as time / no overlap with the interval of
    the paired per-round ratio from the session (among the run's ``sessions``) that measured them side by
    side."""
    rows = []
    for op, rec in decisions["ops"].items():
        at = evidence_tp(rec)
        sess = named(sessions, point_session_name(op, at))
        if sess is None:
            continue
        winner = (rec.get("winner") or {}).get("case")
        rows.append(_group(op, int(at), sess.points, f"{op}-tp{at}-none", winner))
    tp = decisions["meta"].get("model_tp")
    lay = decided_layers(decisions["meta"]).get(str(tp))
    sess = named(sessions, layer_session_name(tp))
    if lay is not None and sess is not None:
        rows.append(_group(BLOCK, int(tp), sess.points, f"layer-tp{tp}-none", lay.winner))
    return rows


def _group(name: str, tp: int, points: dict[str, MeasuredPoint], none_id: str, chosen: str | None) -> dict:
    ratios = _point_ratios(points, none_id)
    bars = []
    for cid in sorted(ratios, key=lambda c: (parse_case_id(c).variant_id != "ub.te", c)):
        v = parse_case_id(cid).variant_id
        kind = ("bound" if v == "nocomm" else "TE defaults" if v == "ub.te" else "chosen" if cid == chosen
                else "preset" if _preset(v) else None)
        if kind is None:
            continue
        bars.append({"case": cid, "variant": v, "kind": kind, "ratio": ratios[cid]})
    if chosen == none_id:   # no overlap chosen: it is the reference itself (drawn at 1, no interval)
        bars.append({"case": none_id, "variant": "none", "kind": "chosen",
                     "ratio": {"ratio": 1.0, "lo": None, "hi": None, "rounds": None}})
    return {"group": name, "tp": tp, "bars": bars}


def plot_summary(rows: list[dict], png: Path) -> Path | None:
    """One picture: per op and for the block, each setting's time / no overlap with its interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [r for r in rows if any(b["ratio"] for b in r["bars"])]
    if not groups:   # nothing compared to no overlap (it failed): no picture, the report says why
        return None
    colors = {"TE defaults": "#8c8c8c", "preset": "#4c72b0", "chosen": "#dd8452", "bound": "#55a868"}
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(groups), 3.6))
    width = 0.8 / max(len(g["bars"]) for g in groups)
    seen = set()
    for gi, g in enumerate(groups):
        for bi, b in enumerate(g["bars"]):
            r = b["ratio"]
            if not r:
                continue
            x = gi - 0.4 + width * (bi + 0.5)
            if not_a_figure(r):   # no bar for a figure the noise cannot support (stats.wording)
                ax.text(x, 1.0, "undecided", rotation=90, ha="center", va="bottom", fontsize=6)
                continue
            err = None
            if r.get("lo") is not None and r.get("hi") is not None:
                err = [[r["ratio"] - r["lo"]], [r["hi"] - r["ratio"]]]
            label = b["kind"] if b["kind"] != "preset" else b["variant"][3:]
            ax.bar(x, r["ratio"], width, color=colors[b["kind"]], yerr=err, capsize=2,
                   label=None if label in seen else label)
            seen.add(label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(groups)), [f"{g['group']}\nTP {g['tp']}" for g in groups])
    ax.set_ylabel("time / no overlap")
    drawn = [b["ratio"] for g in groups for b in g["bars"] if b["ratio"] and not not_a_figure(b["ratio"])]
    lo = min(((r["lo"] or r["ratio"]) for r in drawn), default=1.0)
    ax.set_ylim(max(0.0, lo - 0.05), None)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Each setting against no overlap (95% interval, paired rounds)", fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    write_via_buffer(png, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)
    return png

"""The files users load, one coherent set per TP (issue 33).

Megatron's TP-overlap switches are global (tp_comm_overlap_rs_dgrad acts on qkv and fc1 together, bulk
dgrad/wgrad on both, proj and fc2 have none of their own), and TE reads the ub_cfgs yaml through them: a
yaml of one TP beside the switches of another can run a bulk communicator as a reduce-scatter and corrupt
the input gradient silently. So every TP measured gets its own set, written together from one ub_cfgs and
the switches that make Megatron run it as written:

  te:    tp_comm_overlap_cfg.tp<N>.yaml, megatron_flags.tp<N>.txt, transformer_config_overrides.tp<N>.yaml,
         tp_overlap_cfg_nemo.tp<N>.py, ub_cfgs.tp<N>.json
  torch: chunked_cfg.tp<N>.yaml

and the unsuffixed names hold the model TP's set, only when the model TP is 2 or more and its set did not
fail. Each set is checked (te.check) before it is written; a set whose every overlapped block setting
failed the numerics check is not written at all. Without a block (layer stage off, failed or cut short)
the per-op choices are restricted to one combination Megatron's switches express and marked unproven.
Files of an earlier decision that this one does not write are removed, so a folder never holds a yaml
beside another decision's switches. This module decides the sets (``FileSets``); emit.file_sets writes them.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tptune.cases import parse_case_id
from tptune.decide.layer import per_mode_combos
from tptune.decide.tp_point import best_at, ub_cfgs_at
from tptune.model.ops import Gemm, op_gemms
from tptune.records.layer_result import LayerResult
from tptune.records.run_dir import RunDir
from tptune.stats.wording import UNDECIDED, classify_ratio
from tptune.te import megatron_flags as mf
from tptune.te import ubcfg
from tptune.te.check import check_pair

TE_FILES = {"ub_cfgs_yaml": "tp_comm_overlap_cfg{}.yaml", "megatron_flags": "megatron_flags{}.txt",
            "overrides": "transformer_config_overrides{}.yaml", "bridge": "tp_overlap_cfg_nemo{}.py",
            "ub_cfgs_json": "ub_cfgs{}.json"}
TORCH_FILES = {"chunked_cfg": "chunked_cfg{}.yaml"}
ALL_FILES = {**TE_FILES, **TORCH_FILES}


def names(backend: str, tp: int | None) -> dict[str, str]:
    """{role: file name} of one set; ``tp`` None: the unsuffixed names (the model TP's set)."""
    sfx = "" if tp is None else f".tp{tp}"
    return {role: pat.format(sfx) for role, pat in (TE_FILES if backend == "te" else TORCH_FILES).items()}


@dataclass(frozen=True)
class FileSet:
    """One TP's set as it is written, under each of ``names`` (its own; the model TP's also under the plain
    names). te: ``ub`` and ``switches``, for ``model``/``workload``/``fp8``; torch: ``shape_map``."""
    tp: int
    names: tuple[dict[str, str], ...]
    notes: tuple[str, ...]
    ub: dict | None = None
    switches: dict | None = None
    model: str | None = None
    workload: dict | None = None
    fp8: bool = False
    shape_map: dict | None = None


@dataclass(frozen=True)
class FileSets:
    """The decided sets: ``record`` is meta["files"] as decisions.json holds it, ``sets`` the sets to write.
    Every file named by one of ``ALL_FILES``' patterns that ``sets`` do not write is stale."""
    record: dict
    sets: tuple[FileSet, ...]


def _copies(backend: str, t: int, default_tp: int | None) -> tuple[dict[str, str], ...]:
    return tuple(names(backend, n) for n in ((t, None) if t == default_tp else (t,)))


def check(ub: dict, switches: dict, *, fp8: bool) -> dict:
    """tptune check of a pair: {"ok", "problems": [line]} (te.check: does Megatron + TE run it as written)."""
    res = check_pair(ub, switches, fp8=fp8)
    return {"ok": res.ok, "problems": [p.line() for p in res.problems]}


def _winner_row(rec: LayerResult | None) -> dict | None:
    """The layer record's row of its block-level winner (None: no record, or nothing passed)."""
    return rec.row(rec.winner) if rec is not None and rec.winner is not None else None


def undecided_on_block(rec: LayerResult, margin: float) -> list[dict]:
    """The block's comparisons of its winner whose interval the report words "undecided" (stats.wording:
    it covers 1 and reaches past the margin), the bound and failed settings aside: {"variant", "ratio"}
    each, ratio the winner / that setting as the layer record keeps it."""
    if rec.winner is None:
        return []
    key = "tuned_vs" if rec.winner == rec.tuned else "file_vs"
    out = []
    for r in rec.settings:
        vs = r.get(key) or {}
        if r["case"] == rec.winner or r["variant"] == "nocomm" or not vs or vs.get("failed") or not r.get("median_ms"):
            continue
        if classify_ratio(vs.get("ratio"), margin) == UNDECIDED:
            out.append({"variant": r["variant"], "ratio": vs.get("ratio")})
    return out


def _graded(rec: LayerResult, row: dict, margin: float) -> tuple[str, str]:
    """(status, why) of the set the block-level winner ``row`` of layer record ``rec`` proves: proven where
    its numerics passed and the block compared it with something and decided every comparison; undecided
    where the round budget left one undecided (the report says so of the block too)."""
    status = "proven" if row.get("correct") is True and rec.compared else "unproven"
    why = f"block-level winner at TP {rec.tp} ({rec.num_layers} layers): {row['variant']}: {rec.reason}"
    if row.get("correct") is not True:
        why += "; its numerics were not checked"
    undecided = undecided_on_block(rec, margin)
    if status == "proven" and undecided:
        status = "undecided"
        why += "; undecided against " + ", ".join(
            f"`{u['variant']}`" + (f" ({_iv(u['ratio'])})" if (u.get("ratio") or {}).get("lo") is not None else "")
            for u in undecided) + \
            " on the block: the round budget could not tell them apart beyond the noise"
    return status, why


def _iv(r: dict) -> str:
    return f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}], {r['rounds']} rounds"


def _failed(t: int, rec: LayerResult) -> dict:
    return {"tp": t, "files": {}, "status": "failed",
            "why": f"no overlapped setting passed on the block: {rec.reason}"}


def _te_choice(s, run: RunDir, points_by_op: dict, rec: LayerResult | None, t: int, floor: float):
    """(ub_cfgs, switches, status, why, notes) of TP ``t``: the block-level winner, or without a block the
    per-op choices restricted to one combination Megatron's switches express, unproven."""
    if rec is not None:
        row = _winner_row(rec)
        status, why = _graded(rec, row, floor)
        ub = ubcfg.load_preset(parse_case_id(row["case"]).variant.preset, [run.presets])
        return ub, mf.block_switches(ub), status, why, [why]
    ub, notes = ub_cfgs_at(s, points_by_op, t, floor)
    stage = "is off" if not s.layer.enabled else "did not finish"
    why = f"per-op choices at TP {t}, not proven on a block (the layer stage {stage})"
    try:
        switches = mf.block_switches(ub)
    except ValueError as exc:
        _, mode, ub, notes = min(per_mode_combos(s, points_by_op, t, floor, fastest=False), key=lambda c: c[0])
        why += f"; restricted to the {mode} dgrad combination Megatron's switches express ({exc})"
        switches = mf.block_switches(ub)
    return ub, switches, "unproven", why, [f"UNPROVEN: {why}"] + notes


def te_sets(s, run: RunDir, points_by_op: dict, layer: dict[int, LayerResult], tps: list[int], meta: dict,
            default_tp: int | None = None) -> tuple[dict[str, dict], list[FileSet]]:
    """The te backend's set of each TP in ``tps``, and of ``default_tp`` under the plain names too:
    ({str(tp): set record}, [the sets to write])."""
    floor = s.decision.noise_floor
    fp8 = s.model.workload.is_fp8
    out, written = {}, []
    for t in tps:
        rec = layer.get(t)
        if rec is not None and _winner_row(rec) is None:
            out[str(t)] = _failed(t, rec)
            continue
        ub, switches, status, why, notes = _te_choice(s, run, points_by_op, rec, t, floor)
        checked = check(ub, switches, fp8=fp8)
        if not checked["ok"]:   # never handed out: the set would not run as written
            out[str(t)] = {"tp": t, "files": {}, "status": "failed", "check": checked,
                           "why": f"the set tptune derived is not run as written: {'; '.join(checked['problems'])}"}
            continue
        written.append(FileSet(t, _copies("te", t, default_tp), tuple(notes), ub=ub, switches=switches,
                               model=meta["model"], workload=meta["workload"], fp8=fp8))
        out[str(t)] = {"tp": t, "files": names("te", t), "status": status, "why": why, "check": checked,
                       "switches": switches}
    return out, written


def torch_sets(s, points_by_op: dict, layer: dict[int, LayerResult], tps: list[int],
               default_tp: int | None = None) -> tuple[dict[str, dict], list[FileSet]]:
    """The torch backend's chunk map of each TP (each op's chosen chunk count there, 1: no overlap), and of
    ``default_tp`` under the plain name too: ({str(tp): set record}, [the sets to write])."""
    floor = s.decision.noise_floor
    out, written = {}, []
    for t in tps:
        rec = layer.get(t)
        row = _winner_row(rec)
        if rec is not None and row is None:
            out[str(t)] = _failed(t, rec)
            continue
        # the block picked another setting than the per-op choices (decide.layer): the map holds it, one
        # chunk count for every shape, as te's file holds the block-level winner
        block = parse_case_id(row["case"]).variant if row is not None and rec.winner != rec.tuned else None
        choices = []
        for op, pts in points_by_op.items():
            if t in pts:
                v = block or parse_case_id(best_at(pts[t], floor)[0].case).variant
                n = v.chunks if v.kind == "chunked" else 1
                choices += [(g, n) for g in op_gemms(op, t, s.model) if g.gemm != "wgrad"]
        notes = [f"chunk counts per unsplit GEMM shape [m, k, n] (seed 004 customized_cc) at TP {t}; "
                 f"1 = no overlap; model {s.model.model.name}, {s.backend} backend"]
        try:
            shape_map = chunked_shape_map(choices)
        except ValueError as exc:
            shape_map, notes = {"customized_cc": {}}, notes + [f"not expressible: {exc}"]
        if rec is None:
            status, why = "unproven", f"per-op choices at TP {t}, not proven on a block"
        else:
            status, why = _graded(rec, row, floor)
            v = parse_case_id(row["case"]).variant
            if set(shape_map["customized_cc"].values()) != {v.chunks if v.kind == "chunked" else 1}:
                status = "unproven"   # the map is not what the block measured
                why += (f"; the block measured {row['variant']} for every op, which this map is not (it holds "
                        "the per-op choices, which differ between ops)")
        written.append(FileSet(t, _copies("torch", t, default_tp), tuple(notes + [f"{status}: {why}"]),
                               shape_map=shape_map))
        out[str(t)] = {"tp": t, "files": names("torch", t), "status": status, "why": why}
    return out, written


def chunked_shape_map(choices: Mapping[Gemm, int] | Iterable[tuple[Gemm, int]]) -> dict:
    """Seed 004's ``{"customized_cc": {"[m, k, n]": chunks}}``, keyed by the unsplit per-rank GEMM
    shape (Gemm.shape_key); 1 turns the overlap off for that shape. GEMMs without a collective are
    left out. Two GEMMs of one shape with different chunk counts cannot be expressed: ValueError."""
    items = choices.items() if isinstance(choices, Mapping) else choices
    out: dict[str, int] = {}
    owner: dict[str, Gemm] = {}
    for g, n in items:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{g.op}_{g.gemm}: chunk count must be an integer >= 1, got {n!r}")
        if g.collective == "none":
            continue
        key = g.shape_key
        if key in out and out[key] != n:
            o = owner[key]
            raise ValueError(f"shape {key}: {o.op}_{o.gemm} wants {out[key]} chunks, "
                             f"{g.op}_{g.gemm} wants {n}; one shape takes one chunk count")
        out[key], owner[key] = n, g
    return {"customized_cc": out}


def file_sets(s, run: RunDir, points_by_op: dict, layer: dict[int, LayerResult], tps: list[int], meta: dict) -> FileSets:
    """Every TP's set and the plain-named copy of the model TP's (``run``: where the layer stage's presets lie)."""
    model_tp = meta["model_tp"]
    default_tp = model_tp if model_tp and model_tp >= 2 else None
    if s.backend == "te":
        sets, written = te_sets(s, run, points_by_op, layer, tps, meta, default_tp)
    else:
        sets, written = torch_sets(s, points_by_op, layer, tps, default_tp)
    chosen = sets.get(str(default_tp))
    default = str(default_tp) if chosen is not None and chosen["status"] != "failed" else None
    return FileSets({"model_tp": model_tp, "default": default,
                     "default_files": names(s.backend, None) if default else {}, "sets": sets}, tuple(written))

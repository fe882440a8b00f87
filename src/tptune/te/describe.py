"""A setting in short words, for people: "ring exchange for every GEMM, reduce-scatter inside dgrad",
"fprop ring exchange; dgrad and wgrad bulk, 8 SMs each", "NVIDIA's TP 2 preset `nvidia_bf16_tp2`".

describe_setting() takes a variant (or a case id) with the op it is for, or a ub_cfgs (one op's entries or a
whole file). It names the overlap method of each GEMM, grouping GEMMs whose method and knobs are equal, and
only the knobs that differ from TE's defaults for that method (ubcfg.METHOD_DEFAULTS); NVIDIA's presets are
named, not spelled out. Case ids stay the exact name of a setting (the report's evidence tables use them).
"""
from __future__ import annotations

from pathlib import Path

from tptune.cases import KNOB_TOKENS, CaseIdError, Variant, make_case, parse_case_id, parse_variant
from tptune.model.ops import COLUMN_OPS, LAYER, OP_GEMMS, OPS
from tptune.te.ubcfg import (BUILTIN_PRESET, METHOD_DEFAULTS, METHOD_KNOBS, TE_COMM_PRIORITY, TE_GEMM_PRIORITY,
                             case_ub_cfgs, is_rs_dgrad, load_preset, te_default_ub_cfgs)

# The presets in config/presets, by who made them and for what (their files' headers say where each comes from).
PRESET_TITLES = {
    "nvidia_bf16_tp2": "NVIDIA's TP 2 preset",
    "nvidia_bf16_tp2_recipe": "NVIDIA's TP 2 preset as its recipe runs it",
    "nemo_tp4": "NeMo's TP 4 preset",
    "nemo_tp4_recipe": "NeMo's TP 4 preset as its recipe runs it",
    "nvidia_fp8_tp2": "NVIDIA's FP8 TP 2 preset",
    "nvidia_fp8_tp4": "NVIDIA's FP8 TP 4 preset",
    "launcher_h100_tp2": "NeMo Launcher's H100 TP 2 preset",
}
METHOD_WORDS = {"ring_exchange": "ring exchange", "bulk": "bulk", "pipeline": "pipelined"}
# What a knob is when it is not TE's default (absent from METHOD_DEFAULTS: the value TE takes then).
_OTHER_DEFAULTS = {"atomic_gemm": 0, "fp8_buf": 0, "pipeline_rs_overlap_first_gemm": 0,
                   "comm_priority": TE_COMM_PRIORITY, "gemm_priority": TE_GEMM_PRIORITY}


def describe_setting(setting: str | Variant | None = None, *, op: str | None = None, ub_cfgs: dict | None = None,
                     presets_dir: str | Path | list | None = None) -> str:
    """``setting`` in short words. ``setting``: a variant id or Variant (``op`` says which op's GEMMs, none for a
    whole file such as a block's ``ub.tuned_tp4``), or a case id (its op is the case's; a ``layer`` case is a whole
    file); None describes ``ub_cfgs`` alone. ``ub_cfgs``: the setting's entries where known (decisions.json records
    them per op), else they are resolved from the variant's preset in ``presets_dir`` (then config/presets); a
    preset that cannot be found is named only. Raises CaseIdError for a string that is no variant or case id."""
    if setting is None:
        if ub_cfgs is None:
            raise ValueError("describe_setting: give a setting or its ub_cfgs")
        return _describe_cfgs(ub_cfgs, op)
    if isinstance(setting, str):
        if setting.startswith(tuple(f"{o}-tp" for o in (*OPS, LAYER))):
            case = parse_case_id(setting)
            op, setting = case.op, case.variant
        else:
            setting = parse_variant(setting)
    v = setting
    if op == LAYER:
        op = None
    if v.kind == "none":
        return "no overlap"
    if v.kind == "nocomm":
        return "no communication (the bound)"
    if v.kind == "chunked":
        return f"{v.chunks} chunks"
    if not v.overrides and v.preset == BUILTIN_PRESET:
        return "TE's defaults"
    if not v.overrides and v.preset in PRESET_TITLES:
        return f"{PRESET_TITLES[v.preset]} `{v.preset}`"
    if ub_cfgs is None:
        try:
            # the TP size does not change a case's ub_cfgs; "fp8" admits every knob a recorded setting may carry
            ub_cfgs = (case_ub_cfgs(make_case(op, 2, v), presets_dir, workload="fp8") if op
                       else load_preset(v.preset, presets_dir))
        except (ValueError, CaseIdError):
            return f"preset `{v.preset}`"
    return _describe_cfgs(ub_cfgs, op)


def and_join(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _knob_words(method: str, entry: dict) -> list[str]:
    """The knobs of ``entry`` that differ from TE's defaults for ``method``, in words."""
    defaults = {**_OTHER_DEFAULTS, **METHOD_DEFAULTS[method]}
    words = []
    for knob in KNOB_TOKENS:     # cases.py's order: num_sm, cga_size, set_sm_margin, num_splits, ...
        if knob not in entry or knob not in METHOD_KNOBS[method]:
            continue             # not read by this method (fp8_buf: TE forces it where the method does not read it)
        value = int(entry[knob])
        if knob in defaults and value == int(defaults[knob]):
            continue
        words.append({
            "num_sm": f"{value} SM{'s' if value != 1 else ''}",
            "cga_size": f"CGA {value}",
            "set_sm_margin": "SM margin" if value else "no SM margin",
            "num_splits": f"{value} splits",
            "aggregate": "aggregated" if value else "not aggregated",
            "use_ce": "copy engine" if value else "SM copies",
            "atomic_gemm": "atomic GEMM" if value else "no atomic GEMM",
            "fp8_buf": "FP8 buffer" if value else "no FP8 buffer",
            "pipeline_rs_overlap_first_gemm": "first GEMM overlapped" if value else "first GEMM not overlapped",
            "comm_priority": f"comm priority {value}",
            "gemm_priority": f"GEMM priority {value}",
        }[knob])
    return words


def _knobs_each(knobs: tuple[str, ...], several: bool) -> list[str]:
    """Knob words of a group: a count reads "8 SMs each" over several GEMMs."""
    return [f"{k} each" if several and k.split(" ")[-1] in ("SM", "SMs", "splits") else k for k in knobs]


def _gemm_words(method: str, knobs: tuple[str, ...], several: bool) -> str:
    """"bulk, 8 SMs each, no SM margin": the method, then the knobs that differ from TE's defaults."""
    return ", ".join((METHOD_WORDS.get(method, method), *_knobs_each(knobs, several)))


def _describe_cfgs(cfgs: dict, op: str | None) -> str:
    """One op's GEMMs (``op``) or a whole file's, grouped by equal method and knobs."""
    ops = [op] if op else [o for o in OPS if any(k.startswith(o + "_") for k in cfgs)]
    names = [f"{o}_{g}" for o in ops for g in OP_GEMMS[o] if f"{o}_{g}" in cfgs]
    if not names:
        raise ValueError(f"describe_setting: no GEMM of {op or 'any op'} in the ub_cfgs given")
    default = te_default_ub_cfgs()
    groups: dict[tuple, list[str]] = {}
    for name in names:
        method = cfgs[name]["method"]
        groups.setdefault((method, tuple(_knob_words(method, cfgs[name]))), []).append(name)
    rs = [n.split("_")[0] for n in names if n.endswith("_dgrad") and is_rs_dgrad(n, cfgs[n]["method"])]
    at_default = all(cfgs[n]["method"] == default[n]["method"] and not key[1]
                     for key, members in groups.items() for n in members)
    if at_default and not rs and set(names) == {n for n in default if n.split("_")[0] in ops}:
        return "TE's defaults"
    if len(groups) == 1:
        (method, knobs), = groups
        text = ", ".join((f"{METHOD_WORDS.get(method, method)} for every GEMM", *_knobs_each(knobs, len(names) > 1)))
    elif op:
        text = "; ".join(f"{and_join([n.split('_')[1] for n in members])} {_gemm_words(method, knobs, len(members) > 1)}"
                         for (method, knobs), members in groups.items())
    else:   # a whole file: only its GEMMs that are not at TE's default, named with their ops
        differ = {key: [n for n in members if n not in default or cfgs[n]["method"] != default[n]["method"] or key[1]]
                  for key, members in groups.items()}
        text = "TE's defaults except " + "; ".join(
            f"{_label(members, names)} {_gemm_words(method, knobs, len(members) > 1)}"
            for (method, knobs), members in differ.items() if members)
    if rs:
        column = [o for o in ops if o in COLUMN_OPS]
        where = "dgrad" if op or rs == column else f"{and_join(rs)} dgrad"
        text += f"; reduce-scatter inside {where}" if len(groups) > 1 else f", reduce-scatter inside {where}"
    return text


def _label(members: list[str], names: list[str]) -> str:
    """The GEMMs of a group: "dgrad and wgrad" (one op's), "every fprop" (every fprop in the file), "proj and fc2
    dgrad", "fc1 dgrad and wgrad"."""
    roles = [g for g in ("fprop", "dgrad", "wgrad")
             if [n for n in names if n.endswith("_" + g)] == [n for n in members if n.endswith("_" + g)]
             and any(n.endswith("_" + g) for n in members)]
    rest = [n for n in members if n.split("_")[1] not in roles]
    by_op: dict[str, list[str]] = {}
    for n in rest:
        o, g = n.split("_")
        by_op.setdefault(o, []).append(g)
    same: dict[tuple, list[str]] = {}
    for o, gemms in by_op.items():      # ops whose GEMMs here are the same: "proj and fc2 dgrad"
        same.setdefault(tuple(gemms), []).append(o)
    return ", ".join([f"every {g}" for g in roles]
                     + [f"{and_join(ops)} {and_join(list(gemms))}" for gemms, ops in same.items()])

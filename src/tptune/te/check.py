"""Does Megatron-core + TE run a ub_cfgs file with a set of Megatron switches as written? (issue 33)

``check_pair`` models, without torch or TE, what happens to each of TE's ten GEMM entries: which
communicator TE's ``initialize_ub`` builds for it from the file (or from its defaults when the file
omits it), which job the layer asks that communicator to do under Megatron's switches, and what
comes of the mismatch. Read in these sources:

  TE     Transformer Engine 2.20.2 (the transformer_engine_torch-2.20.2 wheel): pytorch/module/base.py
         (initialize_ub, get_default_config, add_ub, fill_userbuffers_buffer_for_all_gather),
         pytorch/module/layernorm_linear.py and linear.py (__init__ folds the ub_* flags; backward picks
         the communicators). The C++ they call was read at NVIDIA/TransformerEngine@d0067d0da6cb01811b807
         2a7d304f0e00344ce2b (2.20.0.dev0; its base.py initialize_ub and layernorm_linear.py are identical
         to 2.20.2's): common/comm_gemm_overlap/comm_gemm_overlap.cpp (CommOverlapBase,
         CommOverlapP2PBase), pytorch/csrc/extensions/comm_gemm_overlap.cpp (get_buffer,
         copy_into_buffer) and gemm.cpp (generic_gemm's dispatch).
  MCORE  megatron-core 0.19.2: core/extensions/transformer_engine.py (TELinear for proj/fc2,
         TELayerNormColumnParallelLinear for qkv/fc1), core/model_parallel_config.py; Megatron-LM
         training/arguments.py, argument_utils.py, initialize.py (the CLI and the initialize_ub call).

How the switches reach each GEMM (MCORE transformer_engine.py -> TE module __init__):
  GEMM            the layer uses it when                                  as
  qkv/fc1_fprop   tp_comm_overlap_ag and not tp_comm_overlap_disable_<op>   all-gather (ring_exchange)
  qkv/fc1_dgrad   rs = tp_comm_overlap_rs_dgrad and not disable_<op>        reduce-scatter inside dgrad
                  else tp_comm_bulk_dgrad                                  bulk all-gather of the input
  qkv/fc1_wgrad   tp_comm_bulk_wgrad and not rs (TE: "and not            bulk reduce-scatter of dgrad
                  self.ub_overlap_rs_dgrad")
  proj/fc2_fprop  tp_comm_overlap_rs                                       reduce-scatter
  proj/fc2_dgrad  tp_comm_overlap_ag                                       all-gather
  everything      only with tp_comm_overlap (MCORE) and sequence_parallel (TE: every ub_* flag is
                  "and self.sequence_parallel"); Megatron-LM reads the file only with --tp-comm-overlap.

What TE builds from the file (base.py initialize_ub): a qkv/fc1_dgrad whose method is not bulk becomes
a reduce-scatter communicator (ring_exchange: CommOverlapP2P, whose RS buffer holds 2*tp-1 chunks;
pipeline: CommOverlap), and then a config for its wgrad raises ValueError ("Cannot specify user UB config
for '<wgrad>' ..."); the wgrad still gets TE's default bulk communicator. A GEMM the file omits gets
get_default_config's: bulk for qkv/fc1 dgrad and wgrad, ring_exchange for the all-gathers, pipeline for
proj/fc2 fprop. Keys that are not TE GEMM names are never read.

What comes of a communicator asked for another job:
  - a bulk dgrad asked for a reduce-scatter (rs_dgrad on): generic_gemm runs CommOverlapBase::
    split_overlap_rs on it, and so does a *pipeline* dgrad: that function cuts the weight into
    contiguous chunks, right for the transposed weight of an fprop (TN) but not for the dgrad GEMM (NN,
    layernorm_linear.py), so dgrad is silently wrong. Measured: a bulk dgrad 36-141% input-gradient
    error (issue 33, 2x H100), a pipelined one input grad 339 against 1.5 (results/rs-dgrad-x2, 2x H200,
    bf16). A ring_exchange dgrad (CommOverlapP2P, which splits the tokens) matched bit for bit.
  - a ring_exchange reduce-scatter dgrad asked for a bulk all-gather (rs_dgrad off, bulk_dgrad on):
    fill_userbuffers_buffer_for_all_gather asks the 2*tp-1-chunk buffer for a tp-chunk tensor:
    RuntimeError "Invalid shape for a Userbuffers buffer" (FP8: the buffer is not FP8, since TE moves
    a reduce-scatter dgrad out of layers_all_gather_overlap: "Attempting to all-gather FP8 tensor, but
    Userbuffers is not initialized with FP8 buffers").
  - a pipeline dgrad asked for a bulk all-gather: its full-size buffer takes it, so bf16 runs a bulk
    all-gather with the entry's SM knobs (the reduce-scatter the file asks for never happens); FP8
    raises as above unless the entry sets fp8_buf.
Not modelled: Megatron specs whose qkv/fc1 is a plain TEColumnParallelLinear (no fused norm; MoE shared
experts), where MCORE passes only ub_overlap_ag/rs, and the te.ops fused MLP (use_te_op_fuser).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from tptune.errors import ConfigError
from tptune.model.ops import COLUMN_OPS, OPS, ROW_OPS, TE_GEMMS
from tptune.te.megatron_flags import MEGATRON_FIELDS, NO_CLI_FLAG
from tptune.te.ubcfg import (BUILTIN_PRESET, allowed_methods, is_preset_format, resolve_preset_mapping,
                             te_default_ub_cfgs, validate_ub_cfgs)

# What TE does instead of what the pair says (Problem.te_does).
TE_DOES = {
    "assert": "TE or Megatron raises: training does not start or stops in the first backward",
    "ignored": "the entry is never read: that communication runs on NCCL (or the whole file is unused)",
    "bulk_as_reduce_scatter": "a bulk communicator run as a reduce-scatter: silent gradient corruption",
    "te_default_conflict": "the file omits the entry, and TE's default for it conflicts with the switches",
    "pipeline_dgrad": "a pipelined reduce-scatter dgrad: silent gradient corruption (bf16, measured)",
    "reduce_scatter_as_bulk": "a reduce-scatter dgrad entry run as a bulk all-gather: its method is not used",
    "invalid": "an entry TE refuses, never reads or overrides (validate_ub_cfgs's reason)",
}
SEQUENCE_PARALLEL = "sequence_parallel"
MEGATRON_DEFAULTS = "Megatron's defaults for --sequence-parallel --tp-comm-overlap"
_FIELDS_FILE = Path(__file__).resolve().parents[1] / "data" / "megatron_config_fields.yaml"
# ModelParallelConfig fields with a CLI flag that act on nothing here: with TE >= 1.5 MCORE reads
# tp_comm_overlap_ag/rs ("if hasattr(self.config, 'tp_comm_overlap_ag')"), never the split flags.
_NO_EFFECT_FLAGS = ("--no-tp-comm-split-ag", "--disable-tp-comm-split-ag", "--no-tp-comm-split-rs",
                    "--disable-tp-comm-split-rs")


@dataclass
class Problem:
    gemm: str                    # TE's GEMM name, or "*" for the whole file
    switches: dict               # the switches involved, with their values in the pair
    te_does: str                 # a TE_DOES key
    detail: str

    def line(self) -> str:
        sw = ", ".join(f"{k}: {str(v).lower()}" for k, v in self.switches.items())
        return f"{self.gemm}{f' [{sw}]' if sw else ''}: {self.te_does}: {self.detail}"


@dataclass
class CheckResult:
    problems: list[Problem]
    switches: dict               # the switches judged (all eight, and sequence_parallel)
    runs: dict                   # GEMM -> how it runs: "nccl", or "<method> <job>" (e.g. "bulk all-gather")
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"ok": self.ok, "problems": [asdict(p) for p in self.problems], "switches": self.switches,
                "runs": self.runs, "notes": self.notes}


def resolve_switches(switches: dict | None) -> dict:
    """All eight switches and sequence_parallel: Megatron's defaults for a user who passes
    ``--sequence-parallel --tp-comm-overlap`` when ``switches`` is None, else Megatron's defaults under
    those given (a missing sequence_parallel is taken as on: Megatron-LM asserts it with overlap)."""
    if switches is None:
        return {**MEGATRON_FIELDS, "tp_comm_overlap": True, SEQUENCE_PARALLEL: True}
    unknown = sorted(set(switches) - set(MEGATRON_FIELDS) - {SEQUENCE_PARALLEL})
    if unknown:
        raise ValueError(f"switches: unknown {unknown} (expected {', '.join(MEGATRON_FIELDS)}, {SEQUENCE_PARALLEL})")
    bad = sorted(k for k, v in switches.items() if not isinstance(v, bool))
    if bad:
        raise ValueError(f"switches: {bad} must be true/false")
    return {**MEGATRON_FIELDS, SEQUENCE_PARALLEL: True, **switches}


def _uses(sw: dict) -> dict[str, str | None]:
    """GEMM -> the job the layer asks its communicator for under ``sw``: "ag", "rs", "bulk_ag",
    "bulk_rs", or None (NCCL). MCORE transformer_engine.py hands the switches over; TE's
    layernorm_linear.py/linear.py __init__ fold them (the table in the module doc)."""
    on = sw["tp_comm_overlap"] and sw[SEQUENCE_PARALLEL]
    use: dict[str, str | None] = {}
    for op in COLUMN_OPS:
        off = sw[f"tp_comm_overlap_disable_{op}"]
        rs = on and sw["tp_comm_overlap_rs_dgrad"] and not off
        use[f"{op}_fprop"] = "ag" if on and sw["tp_comm_overlap_ag"] and not off else None
        use[f"{op}_dgrad"] = "rs" if rs else ("bulk_ag" if on and sw["tp_comm_bulk_dgrad"] else None)
        use[f"{op}_wgrad"] = "bulk_rs" if on and sw["tp_comm_bulk_wgrad"] and not rs else None
    for op in ROW_OPS:
        use[f"{op}_fprop"] = "rs" if on and sw["tp_comm_overlap_rs"] else None
        use[f"{op}_dgrad"] = "ag" if on and sw["tp_comm_overlap_ag"] else None
    return use


def _involved(gemm: str, sw: dict) -> dict:
    """The switches that decide how ``gemm`` runs, with their values."""
    op, kind = gemm.split("_", 1)
    if op in ROW_OPS:
        names = ["tp_comm_overlap_rs" if kind == "fprop" else "tp_comm_overlap_ag"]
    else:
        names = {"fprop": ["tp_comm_overlap_ag"],
                 "dgrad": ["tp_comm_overlap_rs_dgrad", "tp_comm_bulk_dgrad"],
                 "wgrad": ["tp_comm_overlap_rs_dgrad", "tp_comm_bulk_wgrad"]}[kind]
        if sw[f"tp_comm_overlap_disable_{op}"]:
            names.append(f"tp_comm_overlap_disable_{op}")
    return {n: sw[n] for n in names}


def _why_unused(gemm: str, sw: dict) -> str:
    """Why the layer never asks for ``gemm``'s communicator under ``sw`` (overlap and sequence parallel on)."""
    op, kind = gemm.split("_", 1)
    if op in ROW_OPS:
        return {"fprop": "tp_comm_overlap_rs is off: the fprop reduce-scatter runs on NCCL",
                "dgrad": "tp_comm_overlap_ag is off: the dgrad all-gather runs on NCCL"}[kind]
    disabled = sw[f"tp_comm_overlap_disable_{op}"]
    if kind == "fprop":
        return (f"tp_comm_overlap_disable_{op} turns {op}'s all-gather overlap off (MCORE sets ub_overlap_ag=False)"
                if disabled else "tp_comm_overlap_ag is off: the fprop all-gather runs on NCCL")
    rs = ("tp_comm_overlap_rs_dgrad is off" if not sw["tp_comm_overlap_rs_dgrad"] else
          f"tp_comm_overlap_disable_{op} turns tp_comm_overlap_rs_dgrad off for {op}")
    if kind == "dgrad":
        return f"{rs} and tp_comm_bulk_dgrad is off: dgrad's communication runs on NCCL"
    if sw["tp_comm_overlap_rs_dgrad"] and not disabled:
        return ("with tp_comm_overlap_rs_dgrad TE turns ub_bulk_wgrad off (layernorm_linear.py: "
                "'and not self.ub_overlap_rs_dgrad'): dgrad reduce-scatters inside its own GEMM")
    return "tp_comm_bulk_wgrad is off: dgrad's reduce-scatter runs on NCCL"


def _default_method(gemm: str) -> str:
    return allowed_methods(gemm)[0]      # get_default_config's method (base.py `methods`)


def _entry_problems(cfgs: dict, workload: str) -> tuple[dict, list[Problem]]:
    """The entries validate_ub_cfgs accepts one by one (for TE's rules within an entry), and a Problem
    for each it refuses; then the rules across entries."""
    valid, problems = {}, []
    for key, entry in cfgs.items():
        try:
            validate_ub_cfgs({key: entry}, require_all=False, source="ub_cfgs", workload=workload)
        except ValueError as exc:
            problems.append(Problem(str(key), {}, "invalid", str(exc).removeprefix("ub_cfgs: ")))
        else:
            valid[key] = entry
    for op in COLUMN_OPS:
        dg, wg = f"{op}_dgrad", f"{op}_wgrad"
        if dg in valid and valid[dg]["method"] != "bulk" and wg in valid:
            problems.append(Problem(wg, {}, "assert", (
                f"{dg} is a {valid[dg]['method']} reduce-scatter, and TE's initialize_ub raises ValueError "
                f"'Cannot specify user UB config for {wg!r} when its corresponding dgrad {dg!r} uses a non-bulk "
                f"overlap method' (base.py) whatever the switches: leave {wg} out")))
            del valid[wg]
    try:   # atomic GEMM pairs and whatever else spans entries
        validate_ub_cfgs(valid, require_all=False, source="ub_cfgs", workload=workload)
    except ValueError as exc:
        problems.append(Problem("*", {}, "invalid", str(exc).removeprefix("ub_cfgs: ")))
    return valid, problems


def _dgrad(gemm: str, method: str | None, entry: dict, use: str | None, sw: dict, fp8: bool):
    """(te_does, detail, runs) of a qkv/fc1 dgrad whose file method is ``method`` (None: omitted)."""
    op = gemm.split("_")[0]
    m = method or _default_method(gemm)
    if use == "rs":
        if m == "ring_exchange":
            return None, None, "ring_exchange reduce-scatter"
        how = (f"MCORE hands TE ub_overlap_rs_dgrad, so layernorm_linear.py backward asks {gemm!r} for a "
               f"reduce-scatter inside the dgrad GEMM; generic_gemm (gemm.cpp) runs CommOverlapBase::split_overlap_rs "
               f"on this {m} communicator, which cuts the weight into contiguous chunks as for a transposed (TN) "
               f"fprop weight, while dgrad's GEMM is NN")
        fix = (f"make {gemm} ring_exchange (and leave {op}_wgrad out), or set tp_comm_overlap_rs_dgrad false "
               f"(or tp_comm_overlap_disable_{op} true)")
        if m == "bulk":
            what = "bulk_as_reduce_scatter" if method else "te_default_conflict"
            pre = "" if method else f"the file omits {gemm}, so TE fills it from get_default_config: bulk; "
            harm = ("in bf16 silent gradient corruption (input-gradient error 36-141% on GPUs, issue 33); in FP8 "
                    "NVIDIA's TP 4 preset under these switches erred like FP8 no overlap on 4x H100 "
                    "(results/numerics-calibration), yet the file's bulk entries are still not run as written"
                    if fp8 else "silent gradient corruption (measured on GPUs: input-gradient error 36-141%, issue 33)")
            return what, f"{pre}{how}: {harm}; {fix}", "bulk run as reduce-scatter (corrupt)"
        fp8_note = " (this run is FP8: the same split_overlap_rs runs, not measured there)" if fp8 else ""
        return "pipeline_dgrad", (f"{how}: silent gradient corruption (bf16, 2x H200: input grad off by 339 "
                                  f"against 1.5, results/rs-dgrad-x2){fp8_note}; {fix}"), "pipeline reduce-scatter (corrupt)"
    if use == "bulk_ag":
        if m == "bulk":
            return None, None, "bulk all-gather"
        why = ("tp_comm_overlap_rs_dgrad is off" if not sw["tp_comm_overlap_rs_dgrad"]
               else f"tp_comm_overlap_disable_{op} turns rs_dgrad off for {op}")
        if m == "ring_exchange" or (fp8 and not entry.get("fp8_buf")):
            err = ("'Attempting to all-gather FP8 tensor, but Userbuffers is not initialized with FP8 buffers' "
                   "(base.py fill_userbuffers_buffer_for_all_gather: TE gives a reduce-scatter dgrad no FP8 buffer)"
                   if fp8 else
                   "'Invalid shape for a Userbuffers buffer' (CommOverlapP2P::get_buffer: the reduce-scatter "
                   "buffer holds 2*tp-1 chunks, the all-gather asks for tp)")
            return "assert", (f"{why} and tp_comm_bulk_dgrad is on, so layernorm_linear.py backward all-gathers the "
                              f"input through {gemm!r}, which TE built as a {m} reduce-scatter: RuntimeError {err}; "
                              f"set tp_comm_overlap_rs_dgrad true with tp_comm_bulk_dgrad/wgrad false, or make "
                              f"{gemm} bulk"), "raises"
        return "reduce_scatter_as_bulk", (
            f"{why} and tp_comm_bulk_dgrad is on: TE runs a bulk all-gather on this pipeline communicator "
            f"(CommOverlapBase::bulk_overlap) with its num_sm/cga_size/set_sm_margin, and the reduce-scatter "
            f"the entry asks for never happens (dgrad's reduce-scatter goes to {op}_wgrad or NCCL)"), "pipeline run as bulk all-gather"
    if method:
        return "ignored", f"{_why_unused(gemm, sw)}; this entry is never read", "nccl"
    return None, None, "nccl"


def check_pair(ub_cfgs: dict | None, switches: dict | None = None, *, fp8: bool = False) -> CheckResult:
    """Judge a ub_cfgs (as Megatron-LM loads it: yaml.safe_load of --tp-comm-overlap-cfg) together with
    Megatron's switches (None: Megatron's defaults for --sequence-parallel --tp-comm-overlap). ``fp8``:
    the run uses FP8 (Megatron-LM --fp8-format: initialize_ub gets UserBufferQuantizationMode.FP8)."""
    cfgs = {} if ub_cfgs is None else ub_cfgs
    if not isinstance(cfgs, dict):
        raise ValueError(f"ub_cfgs: expected a mapping of GEMM name -> config, got {type(cfgs).__name__}")
    sw = resolve_switches(switches)
    valid, problems = _entry_problems(cfgs, "fp8" if fp8 else "bf16")
    use = _uses(sw)
    runs = {g: "nccl" for g in TE_GEMMS}
    notes = []
    if not (sw["tp_comm_overlap"] and sw[SEQUENCE_PARALLEL]):
        if cfgs:
            why = ("tp_comm_overlap is off: Megatron-LM initializes userbuffers only with --tp-comm-overlap "
                   "(training/initialize.py) and MCORE passes TE no ub_* flag" if not sw["tp_comm_overlap"] else
                   "sequence_parallel is off: TE's linear modules turn every ub_* flag off without it "
                   "(layernorm_linear.py/linear.py: 'and self.sequence_parallel'; Megatron-LM asserts it)")
            involved = {k: sw[k] for k in ("tp_comm_overlap", SEQUENCE_PARALLEL) if not sw[k]}
            problems.append(Problem("*", involved, "ignored", f"{why}: the whole file ({', '.join(map(str, cfgs))}) is ignored"))
        return CheckResult(problems, sw, runs, notes)
    for gemm in TE_GEMMS:
        if gemm in cfgs and gemm not in valid:
            continue                    # already a problem
        entry = valid.get(gemm)
        method = entry["method"] if entry else None
        op, kind = gemm.split("_", 1)
        if op in COLUMN_OPS and kind == "dgrad":
            te_does, detail, runs[gemm] = _dgrad(gemm, method, entry or {}, use[gemm], sw, fp8)
        elif op in COLUMN_OPS and kind == "wgrad":
            dg = cfgs.get(f"{op}_dgrad")
            rs_dgrad_comm = isinstance(dg, dict) and dg.get("method") in ("ring_exchange", "pipeline")
            te_does = detail = None
            if use[gemm]:
                runs[gemm] = "bulk reduce-scatter"
                if rs_dgrad_comm:
                    runs[gemm] += " (TE's default entry)"
                    notes.append(f"{gemm}: {op}_dgrad is a reduce-scatter in the file, but tp_comm_bulk_wgrad is on: "
                                 f"TE runs dgrad's reduce-scatter on its default bulk {gemm} communicator "
                                 f"(initialize_ub keeps {gemm} among the bulk methods)")
            elif entry:
                te_does, detail = "ignored", f"{_why_unused(gemm, sw)}; this entry is never read"
        else:
            te_does = detail = None
            if use[gemm]:
                runs[gemm] = f"{method or _default_method(gemm)} {'all-gather' if use[gemm] == 'ag' else 'reduce-scatter'}"
            elif entry:
                te_does, detail = "ignored", f"{_why_unused(gemm, sw)}; this entry is never read"
        if te_does:
            problems.append(Problem(gemm, _involved(gemm, sw), te_does, detail))
        elif runs[gemm] not in ("nccl", "raises") and gemm not in cfgs and "default" not in runs[gemm]:
            d = te_default_ub_cfgs()[gemm]
            notes.append(f"{gemm}: not in the file; TE uses its default ({', '.join(f'{k} {v}' for k, v in d.items())})")
    return CheckResult(problems, sw, runs, notes)


def op_modes(runs: dict) -> dict[str, str]:
    """Per op, what runs, in megatron_flags.op_mode's terms: "none", "ub" (row op), "bulk" or
    "rs_dgrad" (column op); "partial" (some GEMMs overlapped, others not: no per-op decision) or
    "broken" (a GEMM raises or corrupts)."""
    out = {}
    for op in OPS:
        r = {k.split("_", 1)[1]: v for k, v in runs.items() if k.startswith(op + "_")}
        if any(v == "raises" or v.endswith("(corrupt)") for v in r.values()):
            out[op] = "broken"
        elif all(v == "nccl" for v in r.values()):
            out[op] = "none"
        elif op in ROW_OPS:
            out[op] = "ub" if all(v != "nccl" for v in r.values()) else "partial"
        elif r["fprop"] != "nccl" and r["dgrad"].endswith("reduce-scatter") and r["wgrad"] == "nccl":
            out[op] = "rs_dgrad"
        elif r["fprop"] != "nccl" and r["dgrad"] == "bulk all-gather" and r["wgrad"].startswith("bulk reduce-scatter"):
            out[op] = "bulk"
        else:
            out[op] = "partial"
    return out


# ---------------------------------------------------------------------------------------------
# Loaders: every bad input is a ConfigError naming the file and the field.
# ---------------------------------------------------------------------------------------------
def _read(path, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), [f"no such file (expected {what})"]) from None
    except IsADirectoryError:
        raise ConfigError(str(p), [f"a folder (expected {what})"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(p), [f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}; "
                                   f"expected {what})"]) from None
    except OSError as exc:
        raise ConfigError(str(p), [f"cannot read it as {what}: {exc.strerror or exc}"]) from None


@dataclass
class UbCfgsFile:
    """A ub_cfgs file as read: ``cfgs`` (GEMM name -> entry; {} for an empty file, TE's defaults), and what
    the reading had to say (``notes``): a tptune preset is read as the ub_cfgs it resolves to."""
    cfgs: dict
    notes: list[str] = field(default_factory=list)


def read_ub_cfgs(path) -> UbCfgsFile:
    """The one reader of a ub_cfgs file (tptune check, tptune verify --cfg/--pair): a --tp-comm-overlap-cfg
    YAML or a ub_cfgs JSON, as Megatron-LM reads it (yaml.safe_load, training/initialize.py): a mapping of
    GEMM name -> entry; an empty file is TE's defaults. A preset in tptune's own format (config/presets:
    ``base`` and ``environment`` beside the entries) is read as the full ub_cfgs it resolves to."""
    p = Path(path)
    text = _read(p, "a --tp-comm-overlap-cfg YAML or ub_cfgs JSON")
    try:
        obj = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(str(p), [f"not {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"]) from None
    if obj is None:
        return UbCfgsFile({})
    if not isinstance(obj, dict):
        raise ConfigError(str(p), [f"expected a mapping of TE GEMM name ({', '.join(TE_GEMMS)}) -> config, "
                                   f"got a {type(obj).__name__}"])
    if not is_preset_format(obj):
        return UbCfgsFile(obj)
    try:
        cfgs, env = resolve_preset_mapping(obj, p)
    except ValueError as exc:
        raise ConfigError(str(p), [str(exc)]) from None
    base = obj.get("base", BUILTIN_PRESET)
    over = "TE's defaults" if base == BUILTIN_PRESET else f"preset {base}'s"
    env_words = f", with {', '.join(f'{k}={v}' for k, v in env.items())} in the environment" if env else ""
    return UbCfgsFile(cfgs, [
        f"{p} is a tptune preset (the format of config/presets): read as the ub_cfgs it resolves to, its entries "
        f"over {over}{env_words}; Megatron-LM's --tp-comm-overlap-cfg takes GEMM entries only (no base, no "
        "environment)"])


def load_ub_cfgs(path) -> dict:
    """``read_ub_cfgs(path).cfgs``."""
    return read_ub_cfgs(path).cfgs


def megatron_config_fields() -> frozenset[str]:
    """TransformerConfig's field names in megatron-core 0.19.2 (data/megatron_config_fields.yaml)."""
    return frozenset(yaml.safe_load(_FIELDS_FILE.read_text())["fields"])


def switches_from_overrides(path) -> dict:
    """The switches a transformer_config_overrides.yaml sets (TransformerConfig field -> value).
    Fields TransformerConfig does not have are refused by name (TransformerConfig(**overrides) raises
    TypeError on them); fields other than the TP-overlap switches and sequence_parallel are left to Megatron."""
    p = Path(path)
    try:
        obj = yaml.safe_load(_read(p, "a TransformerConfig overrides YAML"))
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), [f"not YAML: {exc}"]) from None
    if not isinstance(obj, dict):
        raise ConfigError(str(p), ["expected a mapping of TransformerConfig field -> value"])
    problems = []
    unknown = sorted(str(k) for k in obj if k not in megatron_config_fields())
    if unknown:
        problems.append(f"{', '.join(unknown)}: not TransformerConfig field(s) in megatron-core 0.19.2 "
                        f"(TransformerConfig(**overrides) raises TypeError); the TP-overlap switches are "
                        f"{', '.join(MEGATRON_FIELDS)}")
    keys = (*MEGATRON_FIELDS, SEQUENCE_PARALLEL)
    problems += [f"{k}: expected true/false, got {obj[k]!r}" for k in keys if k in obj and not isinstance(obj[k], bool)]
    if problems:
        raise ConfigError(str(p), problems)
    return {k: obj[k] for k in keys if k in obj}


def _flag_table() -> dict[str, tuple[str, bool]]:
    """Megatron-LM's flag -> (field, value) for the TP-overlap switches: argument_utils.py makes
    ``--<name>`` of a bool field defaulting to False and ``--no-<name>``/``--disable-<name>`` of one
    defaulting to True; the two disable switches are in arguments.py's exclude list (no flag)."""
    table = {"--sequence-parallel": (SEQUENCE_PARALLEL, True)}
    for name, default in MEGATRON_FIELDS.items():
        if name in NO_CLI_FLAG:
            continue
        dashed = name.replace("_", "-")
        if default:
            table[f"--no-{dashed}"] = table[f"--disable-{dashed}"] = (name, False)
        else:
            table[f"--{dashed}"] = (name, True)
    return table


def read_flags(path) -> tuple[dict, str | None]:
    """(switches, --tp-comm-overlap-cfg value or None) of a file of Megatron-LM flags: the file
    ``emit.megatron_switches.write_megatron_flags`` writes (comments included) or any user's, one or
    several flags a line, shell line continuations allowed. Flags outside TP overlap are skipped; an unknown TP-overlap flag
    (one naming tp-comm) is refused by name, as Megatron-LM's argparse (allow_abbrev=False) would."""
    p = Path(path)
    text = _read(p, "a file of Megatron-LM flags").replace("\\\n", " ")
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        raise ConfigError(str(p), [f"cannot split it into flags: {exc}"]) from None
    table, sw, cfg, problems = _flag_table(), {}, None, []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, _, value = tok.partition("=")
        if name in ("--tp-comm-overlap-cfg", "--tp-comm-bootstrap-backend"):
            if not value:
                i += 1
                value = tokens[i] if i < len(tokens) else ""
            if not value or value.startswith("--"):
                problems.append(f"{name}: no value after it")
            elif name == "--tp-comm-overlap-cfg":
                cfg = value
        elif tok in table:
            field_name, v = table[tok]
            sw[field_name] = v
        elif tok in _NO_EFFECT_FLAGS:
            pass
        elif tok.startswith("--") and "tp-comm" in tok:
            hint = next((f"; {n} has no command-line flag in Megatron-LM: set it in the TransformerConfig "
                         f"overrides" for n in NO_CLI_FLAG if n.replace("_", "-") in tok), "")
            problems.append(f"{tok}: not a Megatron-LM flag (its TP-overlap flags are "
                            f"{', '.join(sorted(table))}, --tp-comm-overlap-cfg, --tp-comm-bootstrap-backend){hint}")
        i += 1
    if problems:
        raise ConfigError(str(p), problems)
    return sw, cfg


def switches_from_flags(path) -> dict:
    """The switches a file of Megatron-LM flags sets (see read_flags); sequence_parallel only when
    --sequence-parallel is in it."""
    return read_flags(path)[0]

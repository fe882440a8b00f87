"""The run configuration: validate it (schema + model + TP checks) and resolve what each op runs with."""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import yaml

from tptune.cases import parse_variant
from tptune.errors import ConfigError
from tptune.model.memory import GIB, gpu_memory_bytes, workload_problems
from tptune.model.memory import config_problems as memory_problems
from tptune.model.documents import field_alias_problems, load_yaml
from tptune.settings import backend_defaults
from tptune.settings.blocks import (Confirm, Decision, Hardware, LauncherSettings, Layer, OpSettings, Parallel, Search,
                                    Timing, margins_problem, rounds_problem)
from tptune.settings.schema import problems as schema_problems
from tptune.model.spec import ModelConfig, load_model
from tptune.model.ops import OPS, overlap_ops
from tptune.te.fp8 import fp8_backend_problem, fp8_startup_problems
from tptune.te.methods import knob_config
from tptune.te.traps import auto_ops_note, config_problems as trap_problems, report_md, run_traps
from tptune.te.ubcfg import BUILTIN_PRESET, PRESETS_DIR, load_preset

SCHEMA = yaml.safe_load((Path(__file__).parents[1] / "data" / "config.schema.yaml").read_text())
PER_OP_KEYS = {"timing", "search", "check"}
ROOT = Path(__file__).resolve().parents[3]     # the checkout: Snakefile, config/, rules/
DEFAULTS = Path("config") / "config.yaml"       # what the Snakefile loads before any --configfile
RUN_FILE_HINT = ("a run config YAML (layered over config/config.yaml, as snakemake --configfile is) or a "
                 "run's outputs/<run>/config.json")


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _schema_problems(config: dict) -> list[str]:
    return schema_problems(config, SCHEMA)


@dataclass(frozen=True)
class Host:
    """What the machine resolving a run offers, as measure.preflight.probe_host found it: the GPUs this
    process may use, whether Transformer Engine imports, and (when the hardware is checked) cuda:0's
    compute capability. ``backend: auto`` and the device follow from it; nothing here probes."""
    gpu_ids: tuple[str, ...] = ()
    te_available: bool = False
    capability: tuple[int, int] | None = None
    gpu_memory: int | None = None           # bytes of the first GPU (NVML), None where unknown


@dataclass(frozen=True)
class Settings:
    """A resolved run: the model, the backend and device, and the config's blocks as typed values
    (built once, per-op overrides applied). ``config`` is the merged run config as given, for what
    records it whole (config.json, the deriving jobs' params: ``recorded``); read the typed blocks."""
    config: dict
    model: ModelConfig
    backend: str            # torch | te
    device: str             # cpu | cuda
    run: str
    ops_note: str | None = None     # ops: auto (the default): what it took for this model (traps.auto_ops_note)
    ops: list[str] = field(init=False)
    tp_sizes: list[int] = field(init=False)
    gpus_per_node: int = field(init=False)
    timing: Timing = field(init=False)
    search: Search = field(init=False)
    decision: Decision = field(init=False)
    layer: Layer = field(init=False)
    confirm: Confirm = field(init=False)
    launcher: LauncherSettings = field(init=False)
    hardware: Hardware = field(init=False)
    parallel: Parallel = field(init=False)
    faults: dict = field(init=False)
    per_op: dict = field(init=False, repr=False)

    def __post_init__(self):
        c = self.config
        put = partial(object.__setattr__, self)
        put("ops", list(c["ops"]))
        put("tp_sizes", sorted(c["tp_sizes"]))
        put("gpus_per_node", c.get("gpus_per_node", 8))
        put("timing", Timing.from_dict(c.get("timing")))
        put("search", Search.from_dict(c.get("search")))
        put("decision", Decision.from_dict(c.get("decision")))
        put("layer", Layer.from_dict(c.get("layer")))
        put("confirm", Confirm.from_dict(c.get("confirm")))
        put("launcher", LauncherSettings.from_dict(c.get("launcher")))
        put("hardware", Hardware.from_dict(c.get("hardware")))
        put("parallel", Parallel.from_dict(c.get("parallel")))
        put("faults", dict(c.get("faults") or {}))
        put("per_op", {op: self._merged_op(op) for op in self.ops})

    def _merged_op(self, op: str) -> OpSettings:
        base = {k: self.config.get(k) for k in ("timing", "search") if k in self.config}
        over = self.config.get("op_settings", {}).get(op, {})
        merged = deep_merge(base, over)
        return OpSettings(timing=Timing.from_dict(merged.get("timing")), search=Search.from_dict(merged.get("search")),
                          check=over.get("check", self.backend == "te"))

    def op(self, op: str) -> OpSettings:
        """Timing/search/check for one op: the run's values with the op's own overrides merged over."""
        return self.per_op[op] if op in self.per_op else self._merged_op(op)

    @property
    def window_auto(self) -> bool:
        """timing.window_ms: auto, for the run or an op: the window comes from the node's calibration
        (window_calibration; the workflow's calibrate_window rule)."""
        return any(self.op(op).timing.window_auto for op in self.ops)

    def with_window(self, window_ms: float) -> "Settings":
        """These settings with every ``window_ms: auto`` (the run's, an op's) replaced by ``window_ms``."""
        cfg = copy.deepcopy(self.config)
        for timing in [cfg.get("timing") or {}] + [(o or {}).get("timing") or {}
                                                    for o in (cfg.get("op_settings") or {}).values()]:
            if timing.get("window_ms") == "auto":
                timing["window_ms"] = window_ms
        return replace(self, config=cfg)

    def recorded(self, *keys: str) -> dict:
        """The run config's ``keys`` as it gives them (None where absent): what a deriving job's params
        record, so a changed setting re-derives what it changes."""
        return {k: copy.deepcopy(self.config.get(k)) for k in keys}

    def traps(self) -> list:
        """The traps of this run's config and model (te.traps.run_traps)."""
        return run_traps(self.config, self.model)

    def traps_md(self) -> str:
        """The report's account of the traps and shape mixes of this run (te.traps.report_md)."""
        return report_md(self.config, self.model)


def resolve(config: dict, host: Host, source: str = "config", base_dir: str | Path = ".") -> Settings:
    """Validate a merged run config and everything it points to. Raises ConfigError listing all problems.

    ``host``: what this machine offers (measure.preflight.probe_host): ``backend: auto`` and the device
    follow from it. Whether the machine can run what the config asks (GPUs, Transformer Engine, the
    FP8 recipe on this GPU) is measure.preflight's check, not this one."""
    # before anything walks it: an alias bomb (a YAML file Snakemake loaded) would exhaust memory below
    bombs = field_alias_problems(config) if isinstance(config, dict) else []
    if bombs:
        raise ConfigError(source, bombs)
    problems = _schema_problems(config)
    if problems:
        if any(re.match(r"field '[^'.]+': (unknown key|required but missing)", p) for p in problems):
            problems.append(f"(a run config is {RUN_FILE_HINT}; its keys are those of config/config.yaml)")
        raise ConfigError(source, problems)
    for op, own in (config.get("op_settings") or {}).items():
        if op not in OPS:
            problems.append(f"field 'op_settings.{op}': unknown op (expected one of {', '.join(OPS)})")
        elif not isinstance(own, dict):
            problems.append(f"field 'op_settings.{op}': {own!r} is not a mapping (expected keys "
                            f"{', '.join(sorted(PER_OP_KEYS))})")
        else:
            extra = set(own) - PER_OP_KEYS
            if extra:
                problems.append(f"field 'op_settings.{op}': unknown key(s) {sorted(extra)} "
                                f"(expected {', '.join(sorted(PER_OP_KEYS))})")
            for key in sorted(set(own) & PER_OP_KEYS):     # an op's block has the run-wide block's rules
                sub = SCHEMA["properties"][key] if key != "check" else {"type": "boolean"}
                problems.extend(schema_problems(own[key], sub, f"op_settings.{op}.{key}"))
    if problems:
        raise ConfigError(source, problems)
    for case_id in config.get("faults", {}):
        if not re.fullmatch(r"[a-z0-9]+-tp\d+-.+", case_id):
            problems.append(f"field 'faults.{case_id}': expected a case id <op>-tp<N>-<variant>")
    if not isinstance(config.get("model"), str) or not config["model"].strip():
        problems.append(f"field 'model' = {config.get('model')!r}: expected the path of one model file (a "
                        "Megatron-style .yaml or a Hugging Face config.json)")
        raise ConfigError(source, problems)
    model_path = Path(config["model"])
    if not model_path.is_absolute():
        model_path = Path(base_dir) / model_path
    try:
        # workload.packing is the packing model's (packing_problems below), not the model file's
        mc = load_model(model_path, {k: v for k, v in (config.get("workload") or {}).items() if k != "packing"})
    except ConfigError as exc:
        for p in exc.problems:
            if p.startswith("missing field 'seq_length'"):     # the run's workload, not the model, lacks it
                hf = str(exc.source).endswith(".json")
                problems.append(f"field 'workload.seq_length': required: the model file {exc.source} gives no "
                                f"sequence length{' (a Hugging Face config.json has none)' if hf else ''}; set "
                                f"workload: {{seq_length: <tokens>}} in the run config")
            else:
                problems.append(f"model file {exc.source}: {p}")
        mc = None
    ops_note = None
    if config["ops"] == "auto":
        # a copy: the caller's config (what config.json records) keeps "auto", re-resolved by every step
        config = {**config, "ops": list(overlap_ops(mc)) if mc is not None else list(OPS)}
        if mc is not None:
            ops_note = auto_ops_note(mc)
    node = config.get("gpus_per_node", 8)
    for tp in sorted(config["tp_sizes"]):
        if tp & (tp - 1):
            problems.append(f"field 'tp_sizes': TP={tp} is not a power of two")
        if tp > node:
            problems.append(f"field 'tp_sizes': TP={tp} exceeds gpus_per_node={node} (TP stays within one node)")
        if mc is not None:
            problems.extend(f"field 'tp_sizes': {p}" for p in mc.tp_problems(tp))
    problems.extend(memory_problems(config, mc))
    if (config.get("workload") or {}).get("packing"):
        from tptune.packing.spec import config_problems as packing_problems   # numpy: only for a packing run
        w = mc.workload if mc is not None else None
        problems.extend(packing_problems(config["workload"]["packing"], base_dir, sorted(config["tp_sizes"]),
                                         fp8=bool(w and w.is_fp8), recipe=w.recipe if w else None))
    problems.extend(trap_problems(config, mc))   # ops with nothing under TP overlap in this model
    backend = backend_for(config, host)
    # a copy, as for ops: config.json records "auto", and every step resolves it on its node again
    config = backend_defaults.resolve(config, backend, fp8=mc is not None and mc.workload.is_fp8)
    problems.extend(_knob_search_problems(config, backend))
    problems.extend(named_case_problems(config, backend))
    problems.extend(cross_field_problems(config))
    if mc is not None and mc.workload.is_fp8:
        # FP8: the torch backend refuses it in one line unless workload.fp8_emulation: bf16; the recipe
        # must suit the GPU (hardware.gpu; with this node's GPU known, measure.preflight checks its own).
        if host.capability is None:
            problems.extend(fp8_startup_problems(mc.workload, backend, config.get("hardware")))
        elif line := fp8_backend_problem(mc.workload, backend):
            problems.append(line)
    if mc is not None and not problems:
        problems.extend(_workload_problems(config, mc, host, backend))
    if problems:
        raise ConfigError(source, problems)
    device = "cuda" if host.gpu_ids or backend == "te" else "cpu"   # te without a GPU: preflight refuses it
    w = mc.workload
    run = config.get("run") or f"{mc.model.name}-s{w.seq_length}-b{w.micro_batch_size}-{w.dtype}-{backend}"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run):
        raise ConfigError(source, [f"field 'run' = {run!r}: use letters, digits, '.', '_' and '-' only"])
    if run.startswith("."):   # "." is outputs/ itself, ".." the checkout: a run is a folder inside outputs/
        raise ConfigError(source, [f"field 'run' = {run!r}: expected a folder name inside outputs/, not "
                                   "starting with '.'"])
    if len(run) > MAX_RUN_NAME:   # a folder name: past 255 bytes Snakemake's run dies ("File name too long")
        given = "" if config.get("run") else " (made from the model's name: set run: to a shorter name)"
        raise ConfigError(source, [f"field 'run' = {run[:40]!r}... ({len(run)} characters){given}: expected at most "
                                   f"{MAX_RUN_NAME} characters (it names the folder outputs/<run>/)"])
    return Settings(config=config, model=mc, backend=backend, device=device, run=run, ops_note=ops_note)


def _workload_problems(config: dict, mc: ModelConfig, host: Host, backend: str) -> list[str]:
    """A workload no TP of the run can measure on this device (model.memory.workload_problems), judged with
    the memory the run's memory section uses: hardware.gpu_memory_gb, else the GPU's (NVML), else on CPU a
    rank's share of the host's memory; not judged where it is unknown or parallel.memory_check is off."""
    par = config.get("parallel") or {}
    if par.get("memory_check", True) is False:
        return []
    node = config.get("gpus_per_node", 8)
    gb = (config.get("hardware") or {}).get("gpu_memory_gb")
    if gb:
        mem, where = int(gb * GIB), "hardware.gpu_memory_gb"
    elif host.gpu_ids or backend == "te":
        mem, where = host.gpu_memory, "the GPU's memory"
    else:
        mem, where = gpu_memory_bytes(None, "cpu", ranks_per_host=node), \
            f"a rank's share of the host's memory, gpus_per_node={node} ranks"
    return workload_problems(mc, sorted(config["tp_sizes"]), mem, par.get("memory_fraction", 0.9), where)


def cross_field_problems(config: dict) -> list[str]:
    """Rules between fields that each pass the schema alone, for the run and each op's merged settings:
    timing.min_rounds <= timing.max_rounds; every search.te_presets name is a preset the workers can
    load; decision.step_margin <= decision.noise_floor; decision.min_tp within tp_sizes; no list entry
    twice; every faults entry names a case of this run."""
    out: list[str] = []
    for name in ("ops", "tp_sizes"):
        dup = sorted({v for v in config[name] if config[name].count(v) > 1})
        if dup:
            out.append(f"field '{name}': {', '.join(map(str, dup))} given more than once")
    own_all = config.get("op_settings") or {}
    for op in config["ops"]:
        own = own_all.get(op) or {}
        timing = deep_merge(config.get("timing") or {}, own.get("timing") or {})
        where = f"op_settings.{op}.timing" if {"min_rounds", "max_rounds"} & set(own.get("timing") or {}) \
            else "timing"
        if why := rounds_problem(where, timing.get("min_rounds"), timing.get("max_rounds")):
            out.append(why)
        search = deep_merge(config.get("search") or {}, own.get("search") or {})
        where = f"op_settings.{op}.search" if "te_presets" in (own.get("search") or {}) else "search"
        out.extend(f"field '{where}.te_presets': {p}" for p in preset_problems(search.get("te_presets") or []))
    d = config.get("decision") or {}     # the schema has checked each field's type (resolve)
    if why := margins_problem(d.get("step_margin"), d.get("noise_floor")):
        out.append(why)
    min_tp = d.get("min_tp")
    if min_tp is not None and min_tp > max(config["tp_sizes"]):
        out.append(f"field 'decision.min_tp' = {min_tp} exceeds every TP in tp_sizes {sorted(config['tp_sizes'])}: "
                   f"nothing could be recommended")
    targets = set(config["ops"]) | {"layer"}
    for case_id, spec in (config.get("faults") or {}).items():
        m = re.fullmatch(r"([a-z0-9]+)-tp(\d+)-.+", str(case_id))
        # TP 1: the window calibration's cases (timing.window_ms: auto, tptune calibrate-window --run-config)
        if m and (m[1] not in targets or int(m[2]) not in {1, *config["tp_sizes"]}):
            out.append(f"field 'faults.{case_id}': this run measures no such case (its ops: "
                       f"{', '.join(config['ops'])}, and layer; its tp_sizes: {sorted(config['tp_sizes'])}, "
                       f"and 1 for the window calibration)")
        if not (isinstance(spec, str) and re.fullmatch(r"(raise|hang|exit|corrupt_dgrad)(:\d+)?", spec)):
            out.append(f"field 'faults.{case_id}' = {spec!r}: expected \"raise:<rank>\", \"hang:<rank>\", "
                       f"\"exit:<rank>\" or \"corrupt_dgrad:<rank>\" (torch backend: a planted gradient corruption)")
    return list(dict.fromkeys(out))


def named_case_problems(config: dict, backend: str) -> list[str]:
    """Fields that name a case, a rank or an op, against what this run measures (cross_field_problems has
    checked each faults key's op and TP): a faults entry whose variant this backend never measures (a
    chunk count outside search.chunks, userbuffers on torch, the chunked method on te, a preset that does
    not exist) or whose rank the case's TP group does not have, and an op_settings key for an op the run
    does not tune: each would be accepted and silently never apply."""
    out = []
    own_all = config.get("op_settings") or {}
    ops = config["ops"] if isinstance(config["ops"], list) else list(OPS)
    for op in own_all:
        if op in OPS and op not in ops:
            out.append(f"field 'op_settings.{op}': {op} is not among the ops this run tunes ({', '.join(ops)}): "
                       "its settings would never apply")
    chunks = {c for blk in [config.get("search") or {}] + [(o or {}).get("search") or {} for o in own_all.values()
                                                            if isinstance(o, dict)]
              for c in (blk.get("chunks") or [])}
    presets = {BUILTIN_PRESET} | {p.stem for p in PRESETS_DIR.glob("*.yaml")}
    for case_id, spec in (config.get("faults") or {}).items():
        m = re.fullmatch(r"([a-z0-9]+)-tp(\d+)-(.+)", str(case_id))
        if not m:
            continue
        field_name, tp = f"field 'faults.{case_id}'", int(m[2])
        try:
            v = parse_variant(m[3])
        except ValueError as exc:
            out.append(f"{field_name}: {exc}")
            continue
        if backend == "torch" and v.kind == "ub":
            out.append(f"{field_name}: the torch backend measures no userbuffers setting (its variants: none, "
                       f"nocomm, chunked.n<N> with N in search.chunks {sorted(chunks)})")
        elif backend == "te" and v.kind == "chunked":
            out.append(f"{field_name}: the te backend measures no chunked setting (its variants: none, nocomm, "
                       "ub.<preset>[+...])")
        elif v.kind == "chunked" and v.chunks not in chunks:
            out.append(f"{field_name}: this run measures no chunk count {v.chunks} (search.chunks: {sorted(chunks)})")
        elif v.kind == "ub" and v.preset not in presets and not OWN_PRESET.fullmatch(v.preset):
            out.append(f"{field_name}: no preset {v.preset!r} (valid: {', '.join(sorted(presets))}, or the run's "
                       "own tuned_tp<N>, fastest_tp<N>, tuned_other_dgrad_tp<N>)")
        rank = re.fullmatch(r"[a-z_]+:(\d+)", str(spec))
        if rank and int(rank[1]) >= tp:
            out.append(f"{field_name} = {spec!r}: rank {rank[1]} is not in a TP={tp} group (ranks 0 to {tp - 1})")
    return out


# the presets a run writes for its layer stage (decide.layer)
OWN_PRESET = re.compile(r"(tuned|fastest|tuned_other_dgrad)_tp\d+")


def preset_problems(names: list[str]) -> list[str]:
    """Each name that is not a preset the workers can load (search.ubcfg.load_preset: TE's defaults "te",
    or config/presets/<name>.yaml), naming the valid ones; a preset file that does not load, with why."""
    out = []
    valid = [BUILTIN_PRESET] + sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            out.append(f"{name!r} given more than once")
        if not (PRESETS_DIR / f"{name}.yaml").is_file() and name != BUILTIN_PRESET:
            out.append(f"no preset {name!r} (valid: {', '.join(valid)}; a preset is a file <name>.yaml in "
                       f"{PRESETS_DIR})")
            continue
        try:
            load_preset(name)
        except ValueError as exc:
            out.append(f"preset {name!r} does not load: {exc}")
    return out


def backend_for(config: dict, host: Host) -> str:
    """``backend`` of the run config; ``auto``: te where the host has GPUs and Transformer Engine, else torch."""
    backend = config.get("backend", "auto")
    if backend == "auto":
        backend = "te" if host.gpu_ids and host.te_available else "torch"
    return backend


def _knob_search_problems(config: dict, backend: str) -> list[str]:
    """search.mode knobs (run-wide or per op): the TE backend only, and a valid search.knobs."""
    out = []
    for op in config["ops"]:
        own = ((config.get("op_settings") or {}).get(op) or {}).get("search") or {}
        search = deep_merge(config.get("search") or {}, own)
        where = f"op_settings.{op}.search" if "mode" in own else "search"
        if search.get("mode") == "knobs" and backend != "te":
            out.append(f"field '{where}.mode': knobs searches TE userbuffers knobs and needs backend te "
                       f"(this run's backend is {backend})")
        try:
            knob_config(search.get("knobs"))
        except ValueError as exc:
            where = f"op_settings.{op}.search" if "knobs" in own else "search"
            out.append(f"field '{where}.knobs': {exc}")
    return list(dict.fromkeys(out))


MAX_RUN_NAME = 128      # characters of a run's folder name (file systems allow 255 bytes, some fewer)
MODEL_KEYS = ("hidden_size", "num_attention_heads", "num_layers", "num_hidden_layers", "architectures",
              "model_type", "ffn_hidden_size", "intermediate_size")


def load_config_files(*paths: str | Path) -> dict:
    """Defaults then overrides, as Snakemake merges configfiles."""
    merged: dict = {}
    for p in paths:
        p = Path(p)
        try:
            raw = load_yaml(p.read_text(), str(p))      # aliases bounded (model.documents)
        except FileNotFoundError:
            raise ConfigError(str(p), [f"file not found (expected {RUN_FILE_HINT})"]) from None
        except IsADirectoryError:
            raise ConfigError(str(p), [f"is a folder (expected {RUN_FILE_HINT})"]) from None
        except UnicodeDecodeError:
            raise ConfigError(str(p), [f"not a text file (expected {RUN_FILE_HINT})"]) from None
        if raw is None:    # snakemake refuses an empty --configfile ("keys at top level"): say so here
            raise ConfigError(str(p), [f"empty: a run config gives at least the settings that differ from the "
                                       f"defaults, e.g. model: <file> (expected {RUN_FILE_HINT})"])
        if not isinstance(raw, dict):
            raise ConfigError(str(p), [f"expected a mapping of settings (key: value) at the top level, got a "
                                       f"{type(raw).__name__} (expected {RUN_FILE_HINT})"])
        if raw and any(k in raw for k in MODEL_KEYS):
            raise ConfigError(str(p), ["this is a model file, not a run config: name it in a run config as "
                                       f"`model: {p}` (tptune takes {RUN_FILE_HINT})"])
        merged = deep_merge(merged, raw or {})
    return merged


def defaults_file() -> Path:
    """The defaults a run config is layered over: config/config.yaml of the folder snakemake runs in
    (the Snakefile's configfile), else of this checkout."""
    return DEFAULTS if DEFAULTS.is_file() else ROOT / DEFAULTS


def is_run_record(path: str | Path) -> bool:
    """A run's outputs/<run>/config.json (the workflow writes it: every setting resolved, defaults included)."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    # the workflow marks it (_source); a copy written without the mark still holds the defaults' blocks
    return isinstance(raw, dict) and ("_source" in raw or {"model", "ops", "tp_sizes", "timing", "launcher"} <= set(raw))


def load_run_config(paths: list[str | Path]) -> tuple[dict, str, str]:
    """(config, source, base_dir) from what a user has: a run's outputs/<run>/config.json, read as
    recorded; or run config file(s) (YAML; JSON is YAML too), layered over config/config.yaml as
    ``snakemake --configfile`` layers them. A model file, or a recorded config among others, is refused."""
    paths = [Path(p) for p in paths]
    records = [p for p in paths if is_run_record(p)]
    if records and len(paths) > 1:
        raise ConfigError(", ".join(map(str, paths)),
                          [f"{records[0]} is a run's recorded config.json: it holds every setting already; "
                           "give it alone (or give run config YAMLs, layered over config/config.yaml)"])
    if records:
        cfg = json.loads(records[0].read_text())
        cfg.pop("_source", None)
        return cfg, str(records[0]), cfg.pop("_base_dir", ".")
    defaults = defaults_file()
    if not defaults.is_file():
        raise ConfigError(str(DEFAULTS), ["not found here nor in the tptune checkout: it holds the defaults a run "
                                          "config is layered over (run tptune from the workflow's folder)"])
    given = [p for p in paths if p.resolve() != defaults.resolve()]
    cfg = load_config_files(defaults, *given)
    return cfg, " + ".join([f"{defaults} (defaults)"] + [str(p) for p in given]), "."

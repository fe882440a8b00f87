"""The run configuration: validate it (schema + model + TP checks) and resolve what each op runs with."""
from __future__ import annotations

import copy
import importlib.util
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .errors import ConfigError
from .gpupool import count_gpus
from .schema import problems as schema_problems
from .model import ModelConfig, load_model
from .ops import OPS

CALIBRATION_JSON = "calibration/window.json"    # a run's window calibration (timing.window_ms: auto), beside config.json
SCHEMA = yaml.safe_load((Path(__file__).parent / "data" / "config.schema.yaml").read_text())
PER_OP_KEYS = {"timing", "search", "check"}


def read_calibration(run_dir: str | Path) -> dict | None:
    """The run's window calibration record (window_calibration), or None where it has none."""
    try:
        return json.loads((Path(run_dir) / CALIBRATION_JSON).read_text())
    except (OSError, ValueError):
        return None


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _schema_problems(config: dict) -> list[str]:
    return schema_problems(config, SCHEMA)


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


@dataclass
class Settings:
    config: dict
    model: ModelConfig
    backend: str            # torch | te
    device: str             # cpu | cuda
    run: str

    @property
    def ops(self) -> list[str]:
        return list(self.config["ops"])

    @property
    def tp_sizes(self) -> list[int]:
        return sorted(self.config["tp_sizes"])

    def op_settings(self, op: str) -> dict:
        """Timing/search/check for one op: the run's values with the op's own overrides merged over."""
        base = {k: self.config.get(k) for k in ("timing", "search") if k in self.config}
        over = self.config.get("op_settings", {}).get(op, {})
        merged = deep_merge(base, over)
        merged["check"] = over.get("check", self.backend == "te")
        return merged

    @property
    def window_auto(self) -> bool:
        """timing.window_ms: auto, for the run or an op: the window comes from the node's calibration
        (window_calibration; the workflow's calibrate_window rule)."""
        return any(self.op_settings(op)["timing"].get("window_ms") == "auto" for op in self.ops)

    def with_window(self, window_ms: float) -> "Settings":
        """These settings with every ``window_ms: auto`` (the run's, an op's) replaced by ``window_ms``."""
        cfg = copy.deepcopy(self.config)
        for timing in [cfg.get("timing") or {}] + [(o or {}).get("timing") or {}
                                                    for o in (cfg.get("op_settings") or {}).values()]:
            if timing.get("window_ms") == "auto":
                timing["window_ms"] = window_ms
        return replace(self, config=cfg)

    def launcher_settings(self) -> dict:
        return {"backend": self.backend, "device": self.device, "launcher": self.config["launcher"]}


def resolve(config: dict, source: str = "config", base_dir: str | Path = ".", check_hardware: bool = True) -> Settings:
    """Validate a merged run config and everything it points to. Raises ConfigError listing all problems.

    ``check_hardware=False`` is for steps that only read recorded measurements (search steps,
    decisions, report): they run anywhere, e.g. on a laptop with a GPU node's outputs copied over."""
    problems = _schema_problems(config)
    if problems:
        raise ConfigError(source, problems)
    for op in config.get("op_settings", {}):
        if op not in OPS:
            problems.append(f"field 'op_settings.{op}': unknown op (expected one of {', '.join(OPS)})")
        else:
            extra = set(config["op_settings"][op]) - PER_OP_KEYS
            if extra:
                problems.append(f"field 'op_settings.{op}': unknown key(s) {sorted(extra)} "
                                f"(expected {', '.join(sorted(PER_OP_KEYS))})")
    for case_id in config.get("faults", {}):
        if not re.fullmatch(r"[a-z0-9]+-tp\d+-.+", case_id):
            problems.append(f"field 'faults.{case_id}': expected a case id <op>-tp<N>-<variant>")
    model_path = Path(config["model"])
    if not model_path.is_absolute():
        model_path = Path(base_dir) / model_path
    try:
        mc = load_model(model_path, config.get("workload") or {})
    except ConfigError as exc:
        problems.extend(f"model file {exc.source}: {p}" for p in exc.problems)
        mc = None
    node = config.get("gpus_per_node", 8)
    for tp in sorted(config["tp_sizes"]):
        if tp & (tp - 1):
            problems.append(f"field 'tp_sizes': TP={tp} is not a power of two")
        if tp > node:
            problems.append(f"field 'tp_sizes': TP={tp} exceeds gpus_per_node={node} (TP stays within one node)")
        if mc is not None:
            problems.extend(f"field 'tp_sizes': {p}" for p in mc.tp_problems(tp))
    from .memory import config_problems as memory_problems
    problems.extend(memory_problems(config, mc))
    from .traps import config_problems as trap_problems   # ops with nothing under TP overlap in this model
    problems.extend(trap_problems(config, mc))
    backend = config.get("backend", "auto")
    has_gpu = count_gpus() > 0
    if backend == "auto":
        backend = "te" if has_gpu and te_available() else "torch"
    if check_hardware and backend == "te" and not has_gpu:
        problems.append("field 'backend': te needs CUDA GPUs and none are visible (use backend: torch; on a "
                        "submit host without GPUs, e.g. a Slurm login node, set TPTUNE_SUBMIT_ONLY=1)")
    if check_hardware and backend == "te" and not te_available():
        problems.append("field 'backend': te needs transformer_engine and megatron.core (pip install '.[gpu]'; "
                        "on a submit host without them set TPTUNE_SUBMIT_ONLY=1)")
    problems.extend(_knob_search_problems(config, backend))
    if mc is not None and mc.workload.is_fp8:
        # FP8: the torch backend refuses it in one line unless workload.fp8_emulation: bf16; the recipe
        # must suit the GPU (its compute capability when this node has one, else hardware.gpu).
        from .search.fp8 import device_capability, fp8_startup_problems
        cc = device_capability() if has_gpu and check_hardware else None
        problems.extend(fp8_startup_problems(mc.workload, backend, config.get("hardware"), cc))
    if problems:
        raise ConfigError(source, problems)
    device = "cuda" if has_gpu or (backend == "te" and not check_hardware) else "cpu"
    w = mc.workload
    run = config.get("run") or f"{mc.model.name}-s{w.seq_length}-b{w.micro_batch_size}-{w.dtype}-{backend}"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run):
        raise ConfigError(source, [f"field 'run' = {run!r}: use letters, digits, '.', '_' and '-' only"])
    return Settings(config=config, model=mc, backend=backend, device=device, run=run)


def _knob_search_problems(config: dict, backend: str) -> list[str]:
    """search.mode knobs (run-wide or per op): the TE backend only, and a valid search.knobs."""
    from .search.methods import knob_config

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


def load_config_files(*paths: str | Path) -> dict:
    """Defaults then overrides, as Snakemake merges configfiles."""
    merged: dict = {}
    for p in paths:
        p = Path(p)
        try:
            merged = deep_merge(merged, yaml.safe_load(p.read_text()) or {})
        except FileNotFoundError:
            raise ConfigError(str(p), ["file not found"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError(str(p), [f"cannot parse: {str(exc).splitlines()[0]}"]) from None
    return merged

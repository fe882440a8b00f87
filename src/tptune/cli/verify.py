"""tptune verify: check overlap configs on this node before a long training job.

  tptune verify --model config/models/llama3-70b.yaml --tp 2 --cfg tp_comm_overlap_cfg.yaml [--cfg b.yaml]
                [--seq-length 8192] [--micro-batch-size 1] [--dtype bf16] [--layers 2] [--ops]
                [--config run.yaml] [--json verify.json]

Each --cfg is a Megatron ``--tp-comm-overlap-cfg`` YAML (TE ub_cfgs): it is validated first (unknown
GEMM or knob, a method or knob TE refuses for that GEMM: an error naming the file and the entry,
before anything runs). Then the TP ranks are launched on the local GPUs (the run config's launcher:
warm worker group, safety environment) and one session times a whole transformer block
(``--layers`` layers of the model's real shapes) with no overlap, TE defaults, the configured presets
and every --cfg side by side in alternating rounds, checking each overlapped block's output and input
gradient against the no-overlap block; ``--ops`` adds one such session per linear op. It prints a
table (block ms, ratio to no overlap and to TE defaults with 95% intervals, numerics) and writes JSON.

The torch backend (no GPU) cannot run userbuffers: it validates the files and times the block with
no overlap, the bound and the chunked method, and says so.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tptune.cases import make_case
from tptune.decide.layer import numerics_row
from tptune.errors import ConfigError
from tptune.measure.launch import Launcher
from tptune.measure.preflight import resolve_here
from tptune.measure.session_spec import SessionSpec
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.search.steps import canary_case, point_contenders
from tptune.settings.resolve import DEFAULTS, ROOT, deep_merge, load_config_files
from tptune.stats.noise import compare_points
from tptune.stats.numerics import summary_text
from tptune.te.check import read_ub_cfgs, resolve_switches, switches_from_flags, switches_from_overrides
from tptune.te.megatron_flags import MEGATRON_FIELDS
from tptune.te.ubcfg import validate_ub_cfgs


def load_user_cfg(path: str | Path) -> dict:
    """A --tp-comm-overlap-cfg YAML as a validated partial ub_cfgs, read as tptune check reads it
    (te.check.read_ub_cfgs: an empty file is TE's defaults); ConfigError naming what is wrong."""
    cfgs = read_ub_cfgs(path).cfgs
    try:
        validate_ub_cfgs(cfgs, require_all=False, source=str(path))
    except ValueError as exc:
        raise ConfigError(str(path), [str(exc)]) from None
    return cfgs


def verify_settings(model: str, tp: int, workload: dict, config_files: list[str], layers: int):
    cfg = load_config_files(ROOT / DEFAULTS, *config_files)
    cfg = deep_merge(cfg, {"model": str(model), "workload": {k: v for k, v in workload.items() if v is not None},
                           "tp_sizes": [tp], "run": f"verify-tp{tp}", "layer": {"num_layers": layers}})
    cfg["gpus_per_node"] = max(cfg.get("gpus_per_node", 8), tp)
    return resolve_here(cfg, source=", ".join(config_files) or "tptune verify")


def pair_switches_from(path: str | Path) -> dict[str, bool]:
    """The eight switches of a pair's overrides YAML or megatron_flags.txt (te.check's loaders: Megatron's
    defaults under those given)."""
    load = switches_from_flags if str(path).endswith(".txt") else switches_from_overrides
    sw = resolve_switches(load(path))
    return {k: bool(sw[k]) for k in MEGATRON_FIELDS}


def run_verify(model: str, tp: int, cfg_files: list[str], *, workload: dict | None = None,
               config_files: list[str] = (), layers: int = 2, ops: bool = False,
               out_dir: str | Path | None = None, pairs: list[tuple[str, str]] = ()) -> dict:
    """``pairs``: (ub_cfgs yaml, TransformerConfig overrides yaml) built as written, consistent or not:
    the block shows what Megatron + TE do with that pair (its numerics tell a corrupting one)."""
    s = verify_settings(model, tp, workload or {}, list(config_files), layers)
    users = {f"user{i + 1}": (Path(f), load_user_cfg(f)) for i, f in enumerate(cfg_files)}
    pair_switches = {}
    for i, (cfg, sw) in enumerate(pairs):
        users[f"pair{i + 1}"] = (Path(cfg), load_user_cfg(cfg))
        pair_switches[f"pair{i + 1}"] = pair_switches_from(sw)
    work = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="tptune-verify-"))
    folder = RunDir(work)      # laid out as a run folder: presets/, sessions/<op>/tp<N>
    presets = folder.presets
    presets.mkdir(parents=True, exist_ok=True)
    for name, (path, _) in users.items():
        shutil.copy(path, presets / f"{name}.yaml")
    if s.backend == "te":
        variants = ["none", "ub.te"] + [f"ub.{p}" for p in s.search.te_presets] + \
                   [f"ub.{n}" for n in users]
        note = None
    else:
        variants = ["none", "nocomm", "chunked.n2"]
        note = ("torch backend: userbuffers need the te backend and CUDA GPUs; the files were validated, and "
                "the block was timed with no overlap, the bound and the chunked method")
    launcher = Launcher(s)
    floor = s.decision.noise_floor

    def session(op: str) -> dict:
        members = [make_case(op, tp, v) for v in dict.fromkeys(variants)]
        op_settings = s.op(s.ops[0] if op == "layer" else op).as_dict()
        op_settings.update(check=True, layer={"num_layers": layers},
                           te={**op_settings.get("te", {}), "presets_dirs": [str(presets.resolve())],
                               "preset_switches": pair_switches})
        sdir = folder.sessions / op / f"tp{tp}"
        spec = SessionSpec(f"{op}/tp{tp}", members, s.model, op_settings,
                           canary=canary_case(s, tp) if op == "layer" else None, margin=floor,
                           contenders=point_contenders(members))
        rec = launcher.session(spec, sdir)
        runs = load_session(sdir).points
        none, te = runs.get(f"{op}-tp{tp}-none"), runs.get(f"{op}-tp{tp}-ub.te")
        rows = []
        for cid, r in runs.items():
            row = {"case": cid, "setting": cid.split("-", 2)[2], "status": r.status, "ms": r.recorded_median(),
                   "error": r.error_message, "numerics": r.correct, "errors": numerics_row(r.correctness),
                   "file": str(users[cid.split("ub.", 1)[1]][0]) if "ub.user" in cid or "ub.pair" in cid else None,
                   "switches": pair_switches.get(cid.split("ub.", 1)[-1])}
            for ref_name, ref in (("vs_none", none), ("vs_te", te)):
                if ref is not None and ref is not r and r.status == "ok":
                    row[ref_name] = compare_points(r, ref, floor=floor, tie="b").to_dict()
            rows.append(row)
        return {"session": rec["session"], "rounds": rec["rounds"], "stop": rec["stop"], "rows": rows}

    result = {"model": s.model.model.name, "tp": tp, "backend": s.backend, "layers": layers,
              "workload": s.model.to_dict()["workload"], "note": note, "block": session("layer")}
    if ops:
        result["ops"] = {op: session(op) for op in s.ops}
    return result


def _r(cmp: dict | None) -> str:
    r = (cmp or {}).get("ratio")
    if not r:
        return "–"
    return f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"


def _errs(row: dict) -> str:
    """"1.48% (1.00x) / 2.54% (1.00x) / 1.2% (1.01x)" of a row's numerics against the fp32 block."""
    return summary_text(((row.get("errors") or {}).get("summary")) or {}, times="x") or "–"


def format_table(res: dict) -> str:
    lines = [f"tptune verify: {res['model']} TP={res['tp']} ({res['backend']}), {res['layers']}-layer block, "
             f"{res['block']['rounds']} rounds ({res['block']['stop']})"]
    if res.get("note"):
        lines.append(res["note"])
    head = (f"{'setting':32s} {'block ms':>9s} {'vs no overlap':>22s} {'vs TE defaults':>22s} numerics "
            f"{'out/in-grad/worst wgrad rel. L2 (x no overlap)':>48s}")
    if res.get("ops"):
        head += "  " + " ".join(f"{op:>7s}" for op in res["ops"])
    lines.append(head)
    per_op = {op: {r["setting"]: r for r in sess["rows"]} for op, sess in (res.get("ops") or {}).items()}
    for row in res["block"]["rows"]:
        name = row["setting"] + (f" ({Path(row['file']).name})" if row.get("file") else "")
        ms = f"{row['ms']:.3f}" if row["ms"] else row["status"]
        num = {True: "ok", False: "FAILED", None: "–"}[row["numerics"]]
        line = f"{name:32s} {ms:>9s} {_r(row.get('vs_none')):>22s} {_r(row.get('vs_te')):>22s} {num:8s} {_errs(row):>48s}"
        if per_op:
            line += "  " + " ".join(f"{(per_op[op].get(row['setting']) or {}).get('ms') or 0:7.3f}" for op in per_op)
        lines.append(line)
    return "\n".join(lines)

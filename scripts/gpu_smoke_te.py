"""GPU smoke test of the te backend through the real launcher (warm worker group, run.json, traces).

Run on a machine with >= 2 GPUs, TE and Megatron-core (from the repository root):
    PYTHONPATH=src python3 scripts/gpu_smoke_te.py --out OUTDIR
Measures Llama-3-70B (seq 8192, mbs 1, bf16) at TP=2 for qkv/proj/fc1/fc2 x none/nocomm/ub.te (+ one
override for qkv) in ONE warm worker group (so the backend's re-entrancy is exercised), prints the
medians against the figures in shared/device/README.md, and leaves in OUTDIR:
  smoke.log, summary.json, results.tar.gz (every case's run.json + rank-0 trace, the worker log).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# shared/device/README.md, H200, TP=2, fwd+bwd median (ms)
README_TP2 = {
    "nocomm": {"qkv": 2.941, "proj": 2.345, "fc1": 15.956, "fc2": 8.246},
    "none": {"qkv": 3.328, "proj": 2.915, "fc1": 16.596, "fc2": 8.383},
    "ub.te": {"qkv": 3.319, "proj": 2.658, "fc1": 17.127, "fc2": 8.611},
}
OPS = ("qkv", "proj", "fc1", "fc2")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "smoke-out"))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default="config/models/llama3-70b.yaml")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--variants", default="none,nocomm,ub.te")
    ap.add_argument("--extra", default="qkv:ub.te+dgrad.bulk.sm8.cga2", help="op:variant[,op:variant]")
    ap.add_argument("--case-timeout", type=float, default=90.0)
    ap.add_argument("--backend", default="te", help="te; torch only to try this script on a CPU machine")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    log = open(out / "smoke.log", "a")

    def say(*a):
        msg = " ".join(str(x) for x in a)
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    import torch

    from tptune.cases import make_case
    from tptune.measure.gpupool import count_gpus
    from tptune.measure.launch import Launcher
    from tptune.measure.preflight import resolve_here, te_available
    from tptune.settings.resolve import load_config_files

    n_torch = torch.cuda.device_count()  # no CUDA context is created in this (client) process
    say(f"count_gpus()={count_gpus()} torch.cuda.device_count()={n_torch} te_available()={te_available()} "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    if count_gpus() != n_torch:
        say(f"NOTE: /proc/driver/nvidia/gpus lists {count_gpus()} GPUs, CUDA sees {n_torch}: "
            f"setting CUDA_VISIBLE_DEVICES to the ones CUDA sees")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n_torch))
    say("env:", {k: os.environ.get(k) for k in ("UB_SKIPMC", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                              "NVSHMEM_DISABLE_NVLS", "CUDA_DEVICE_MAX_CONNECTIONS")})

    work = Path(tempfile.mkdtemp(prefix="tptune-smoke-"))
    cfg = load_config_files(ROOT / "config" / "config.yaml")
    cfg.update(model=args.model, backend=args.backend, tp_sizes=[args.tp], ops=args.ops.split(","), run="smoke")
    cfg["timing"] = {"warmup": 5, "iters": 10, "min_rounds": 3, "max_rounds": 3, "profile_steps": 2}
    cfg["launcher"].update(pool_dir=str(work / "pool"), case_timeout_s=args.case_timeout, idle_timeout_s=90,
                           retries=0)
    t0 = time.time()
    s = resolve_here(cfg, base_dir=ROOT)
    say(f"resolve ok: backend={s.backend} device={s.device} model={s.model.model.name} "
        f"tokens={s.model.workload.tokens} ({time.time() - t0:.2f}s)")
    launcher = Launcher(s)

    cases = [make_case(op, args.tp, v) for op in s.ops for v in args.variants.split(",")]
    for spec in filter(None, args.extra.split(",")):
        op, v = spec.split(":", 1)
        cases.append(make_case(op, args.tp, v))
    # ub cases interleaved with none/nocomm: the warm group builds and tears down UB again and again
    stage = work / "stage"
    stage.mkdir()
    rows = []
    for case in cases:
        op_settings = s.op(case.op).as_dict()
        case_dir = work / "runs" / case.dir
        t1 = time.time()
        try:
            run = launcher.profile(case, s.model, case_dir, op_settings)
        except Exception:  # noqa: BLE001 - keep going, report
            say(f"{case.id}: launcher raised\n{traceback.format_exc()}")
            continue
        name = case.id.replace("+", "_")
        shutil.copy(case_dir / "run.json", stage / f"{name}.run.json")
        for tr in run.get("traces") or []:
            if ".rank0." in tr:
                shutil.copy(case_dir / tr, stage / f"{name}.{tr}")
        med = run.get("timing", {}).get("total_ms", {}).get("median")
        corr = run.get("correctness") or {}
        rows.append({"case": case.id, "op": case.op, "variant": case.variant_id, "status": run["status"],
                     "median_ms": med, "fwd_ms": run.get("timing", {}).get("fwd_ms", {}).get("median"),
                     "bwd_ms": run.get("timing", {}).get("bwd_ms", {}).get("median"),
                     "spread": run.get("timing", {}).get("total_ms", {}).get("spread"),
                     "correct": corr.get("ok"), "max_abs_err": corr.get("max_abs_err"),
                     "max_rel_err": corr.get("max_rel_err"), "init_s": run.get("launch", {}).get("init_s"),
                     "wall_s": time.time() - t1, "error": run.get("error")})
        say(f"{case.id}: {run['status']} median={med} correct={corr.get('ok')} wall={time.time() - t1:.1f}s"
            + (f" error={json.dumps(run.get('error'))[:3000]}" if run["status"] != "ok" else ""))
        _pack(out, stage, work, rows)

    say("\n| op | variant | median ms (fwd+bwd) | README TP=2 | ratio | correctness |")
    say("|---|---|---|---|---|---|")
    for r in rows:
        ref = README_TP2.get(r["variant"], {}).get(r["op"])
        ratio = f"{r['median_ms'] / ref:.3f}" if ref and r["median_ms"] else ""
        med = f"{r['median_ms']:.3f}" if r["median_ms"] else r["status"]
        say(f"| {r['op']} | {r['variant']} | {med} | {ref or ''} | {ratio} | {r['correct']} |")
    for r in rows:
        if r["max_abs_err"]:
            say(f"{r['case']}: max_abs_err={r['max_abs_err']} max_rel_err={r['max_rel_err']}")
    _pack(out, stage, work, rows)
    for entry in (work / "pool").rglob("srv-*.json"):  # stop the warm group now
        from tptune.measure.launch import WorkerGroup
        gpus = entry.stem[4:].split("-")
        WorkerGroup(entry.parent, gpus, len(gpus), "").stop()
    ok = rows and all(r["status"] == "ok" and r["correct"] for r in rows) and len(rows) == len(cases)
    say(f"smoke {'PASSED' if ok else 'FAILED'} in {time.time() - t0:.0f}s")
    return 0 if ok else 1


def _pack(out: Path, stage: Path, work: Path, rows: list) -> None:
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    tmp = out / "results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(stage.iterdir()):
            tar.add(f, arcname=f.name)
        for f in sorted((work / "pool").rglob("srv-*.log")):
            tar.add(f, arcname=f.name)
    os.replace(tmp, out / "results.tar.gz")


if __name__ == "__main__":
    sys.exit(main())

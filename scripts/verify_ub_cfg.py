"""Load an emitted tp_comm_overlap_cfg.yaml with yaml.safe_load, pass it unchanged to TE's
initialize_ub, and run fwd+bwd of the four Megatron-core TE layers with it (correctness checked
against the no-overlap layers). Runs through tptune's real launcher; needs GPUs, TE, Megatron-core.

    python3 scripts/verify_ub_cfg.py outputs/<run>/tp_comm_overlap_cfg.yaml --model config/models/llama3-70b.yaml --tp 4
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tptune.cases import make_case  # noqa: E402
from tptune.measure.launch import Launcher  # noqa: E402
from tptune.measure.preflight import resolve_here  # noqa: E402
from tptune.settings.resolve import load_config_files  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("yaml")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    cfg = load_config_files(root / "config" / "config.yaml")
    cfg.update(model=a.model, backend="te", tp_sizes=[a.tp])
    cfg["launcher"]["pool_dir"] = tempfile.mkdtemp(prefix="tptune-verify-")
    s = resolve_here(cfg, base_dir=root)
    launcher = Launcher(s)
    out = Path(a.out or tempfile.mkdtemp(prefix="verify-"))
    rows = []
    for op in s.ops:
        settings = dict(s.op(op).as_dict(), check=True, te={"ub_cfgs_file": str(Path(a.yaml).resolve())})
        settings["timing"] = {"warmup": 3, "iters": 5, "min_rounds": 1, "max_rounds": 1, "profile_steps": 0}
        case = make_case(op, a.tp, "ub.te")  # the preset is ignored: the file's ub_cfgs are used as they are
        run = launcher.profile(case, s.model, out / op, settings)
        rows.append({"op": op, "status": run["status"], "median_ms": (run.get("timing") or {}).get("total_ms", {}).get("median"),
                     "correct": (run.get("correctness") or {}).get("ok"), "error": run.get("error")})
        print(json.dumps(rows[-1]))
    ok = all(r["status"] == "ok" and r["correct"] for r in rows)
    print("VERIFY", "OK" if ok else "FAILED", a.yaml)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

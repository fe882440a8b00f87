"""One GPU, te backend: an op that runs at several shapes under one communicator config is built and timed
at each shape (measure.worker.harness.run_case), and its samples are the share-weighted mix.

    bash .device/run.sh python3 scripts/gpu_shape_mix_tp1.py <model config.json or yaml> [seq_length]
At TP 1 (no TP communication: nothing about overlap), fc1 and fc2 of a model whose dense layers and shared
experts differ in width (e.g. Llama-4 Maverick, DeepSeek-V3) are measured with the no-overlap setting;
checks that each shape's weight is the shape asked for, that the mix equals the share-weighted sum of
the shapes' samples, and that the wider shape takes longer. Prints one JSON line; exit 1 on a failure.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from tptune.cases import make_case  # noqa: E402
from tptune.measure.worker.context import RankContext  # noqa: E402
from tptune.measure.worker.harness import run_case  # noqa: E402
from tptune.model.ops import op_mix  # noqa: E402
from tptune.model.spec import load_model  # noqa: E402

SETTINGS = {"backend": "te", "timing": {"warmup": 3, "iters": 10, "mode": "events"}}


def main() -> int:
    path = sys.argv[1]
    seq = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    mc = load_model(path, {"seq_length": seq, "micro_batch_size": 1, "dtype": "bf16"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    ctx = RankContext(0, 1, 0, torch.device("cuda", 0), dist.group.WORLD, dist.new_group(backend="gloo"))
    out, ok = {"model": mc.model.name, "seq": seq, "ops": {}}, True
    for op in ("fc1", "fc2"):
        mix = op_mix(op, mc)
        res = run_case(make_case(op, 1, "none"), mc, ctx, dict(SETTINGS), Path(tempfile.mkdtemp()) / op)
        shapes = res.get("shapes") or []
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        rec = {"shapes": [{"what": s["what"], "k_in": s["k_in"], "n_out": s["n_out"], "layers": s["layers"],
                           "share": s["share"], "median_ms": med(s["samples"]["total_ms"])} for s in shapes],
               "mix_median_ms": med(res["samples"]["total_ms"])}
        n = len(res["samples"]["total_ms"])
        want = [sum(s["share"] * s["samples"]["total_ms"][i] for s in shapes) for i in range(n)]
        rec["mix_is_weighted_sum"] = all(abs(a - b) <= 1e-6 * max(1.0, b) for a, b in zip(res["samples"]["total_ms"], want))
        rec["shapes_as_model"] = [(s["k_in"], s["n_out"], s["layers"]) for s in shapes] == \
            [(s.k_in, s.n_out, s.layers) for s, _ in mix]
        widths = sorted(rec["shapes"], key=lambda s: s["k_in"] * s["n_out"])
        rec["wider_is_slower"] = len(widths) > 1 and widths[-1]["median_ms"] > widths[0]["median_ms"]
        ok &= len(shapes) > 1 and rec["mix_is_weighted_sum"] and rec["shapes_as_model"] and rec["wider_is_slower"]
        out["ops"][op] = rec
    out["ok"] = bool(ok)
    print(json.dumps(out))
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

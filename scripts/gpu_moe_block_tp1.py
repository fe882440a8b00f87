"""Build the Megatron-core MoE block at TP 1 through the te backend's block builder (worker/te_block.py)
and run fwd+bwd with its numerics check (issue 29: GPU validation of the MoE layer on one GPU).

Run on a one-GPU machine with the GPU bundle (/work/shared/device/README.md):
    bash .device/run.sh python3 scripts/gpu_moe_block_tp1.py [config/models/tiny-moe.yaml] [seq_length]
Builds TeBlockBench for layer-tp1-none (2 layers: [dense, MoE] for a model with dense layers, else
[MoE, MoE]), checks the block really holds a router, routed experts and a shared expert, runs fwd+bwd a
few times, times them with CUDA events, and runs the bench's correctness() (finite output and input
gradient at TP 1; the overlap comparison needs TP >= 2). Prints one JSON line; exit 1 on any failure.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from tptune.cases import make_case  # noqa: E402
from tptune.model.spec import load_model  # noqa: E402
from tptune.measure.worker.context import RankContext  # noqa: E402
from tptune.measure.worker.te_block import TeBlockBench  # noqa: E402


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "config/models/tiny-moe.yaml"
    seq = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    mc = load_model(path, {"seq_length": seq, "micro_batch_size": 1, "dtype": "bf16"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    ctx = RankContext(0, 1, 0, torch.device("cuda", 0), dist.group.WORLD, dist.new_group(backend="gloo"))
    bench = TeBlockBench(make_case("layer", 1, "none"), mc, ctx, {"layer": {"num_layers": 2}})
    names = [n for n, _ in bench.block.named_modules()]
    found = {"router": any(n.endswith("mlp.router") for n in names),
             "experts": any(".mlp.experts" in n for n in names),
             "shared_experts": any(".mlp.shared_experts" in n for n in names)}
    want_shared = bool(mc.model.moe_shared_expert_intermediate_size)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        bench.forward()
        bench.backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        bench.zero_grad()
    check = bench.correctness()
    ok = bool(check.get("ok")) and found["router"] and found["experts"] and found["shared_experts"] == want_shared
    print(json.dumps({"model": mc.model.name, "seq": seq, "built": found, "pattern": mc.model.block_pattern(2),
                      "fwd_bwd_ms": [round(t, 3) for t in times[2:]], "correctness": check, "ok": ok},
                     default=str))
    bench.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"done in {time.time() - t0:.1f}s rc={rc}")
    sys.exit(rc)

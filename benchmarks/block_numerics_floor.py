"""How far apart are two no-overlap blocks with the same weights, input and grad_out (the floor under any
overlap numerics check), and how far is each overlapped setting from the no-overlap block?

The layer stage checks an overlapped block against a no-overlap block at TE's tolerances. When even two
no-overlap blocks differ beyond them (nondeterministic kernels, e.g. attention backward, whose tiny
differences FP8 quantization can amplify), the check cannot tell an overlap bug from that floor. This
prints, per setting, TE's measure (the largest |diff| and the relative error there) for the output and the
input gradient against the first no-overlap block, the second no-overlap block's figures first.

  torchrun --nproc-per-node 2 benchmarks/block_numerics_floor.py --model config/models/llama3-70b.yaml \
      --dtype fp8 --recipe delayed [--variant ub.te --variant ub.nvidia_fp8_tp2] [--layers 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from tptune.cases import make_case
from tptune.model.spec import load_model
from tptune.measure.worker import te_backend as tb
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.te_block import TeBlockBench


def _grads(bench: TeBlockBench, block) -> dict:
    bench.zero_grad()
    x = bench.x.detach().clone().requires_grad_(True)
    out = bench._run(block, x)
    out.backward(bench.grad_out)
    res = {"output": out.detach().clone(), "input": x.grad.detach().clone()}
    for p in block.parameters():
        p.grad = None
    return res


def _max_err(test: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """TE's pairwise measure: the largest absolute difference and the relative error at that element."""
    diff = (test.float() - ref.float()).abs().flatten()
    m = int(torch.argmax(diff))
    return float(diff[m]), float(diff[m]) / max(abs(float(ref.flatten()[m])), 1e-5)


def _errs(test: dict, ref: dict, group) -> dict:
    names = sorted(test)
    v = torch.tensor([e for n in names for e in _max_err(test[n], ref[n])], device=test[names[0]].device,
                     dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX, group=group)
    v = v.tolist()
    mags = {n: float(ref[n].float().abs().max()) for n in names}
    return {n: {"abs": v[2 * i], "rel": v[2 * i + 1], "max_abs_ref": mags[n]} for i, n in enumerate(names)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--seq-length", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="overlapped settings to compare (ub.<preset>)")
    ap.add_argument("--warm", type=int, default=3, help="fwd+bwd passes of each block before it is compared")
    ap.add_argument("--json")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    ctx = RankContext(rank, world, rank, torch.device("cuda", torch.cuda.current_device()), dist.group.WORLD,
                      dist.new_group(backend="gloo"))
    workload = {"seq_length": a.seq_length, "micro_batch_size": 1, "dtype": a.dtype}
    if a.recipe:
        workload["recipe"] = a.recipe
    mc = load_model(a.model, workload)
    settings = {"layer": {"num_layers": a.layers}, "te": {}}

    def warmed(bench, block):
        for _ in range(a.warm):   # the measured blocks have run many passes before their check
            _grads(bench, block)
        return _grads(bench, block)

    base = TeBlockBench(make_case("layer", world, "none"), mc, ctx, settings)
    ref = warmed(base, base.block)
    twin = base._build(False)
    tb.copy_module_state(twin, base.block)
    rows = {"none (second block)": _errs(warmed(base, twin), ref, ctx.group)}
    del twin
    again = _grads(base, base.block)
    rows["none (same block again)"] = _errs(again, ref, ctx.group)
    for v in a.variant:
        b = TeBlockBench(make_case("layer", world, v), mc, ctx, settings)
        tb.copy_module_state(b.block, base.block)
        rows[v] = _errs(warmed(b, b.block), ref, ctx.group)
        b.close()
    base.close()
    if rank == 0:
        title = f"{Path(a.model).stem} TP={world} {a.dtype}{' ' + a.recipe if a.recipe else ''}, {a.layers} layers, " \
                f"NVTE_ALLOW_NONDETERMINISTIC_ALGO={os.environ.get('NVTE_ALLOW_NONDETERMINISTIC_ALGO', 'unset')}"
        print(title)
        print(f"{'against the first no-overlap block':36s} {'tensor':7s} {'max|diff|':>10s} {'rel there':>10s} {'max|ref|':>10s}")
        for name, errs in rows.items():
            for t, e in errs.items():
                print(f"{name:36s} {t:7s} {e['abs']:10.4g} {e['rel']:10.4g} {e['max_abs_ref']:10.4g}")
        if a.json:
            Path(a.json).write_text(json.dumps({"title": title, "rows": rows}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark of ``tptune analyze`` on a large synthetic Kineto trace, side by
side with HolisticTraceAnalysis (HTA) comm/comp overlap.

    python benchmarks/trace_bench.py                  # 400 MB trace
    python benchmarks/trace_bench.py --size-mb 20     # small mode
    python benchmarks/trace_bench.py --no-hta         # skip HTA

The trace is generated streaming (chunks written as produced) and has the
structure of a real TE trace: ProfilerStep#N and tptune.forward/backward ranges,
cpu_ops, cudaLaunchKernel runtime events, kernels on several streams with
correlation ids, ac2g flows, a backward autograd thread. Two variants are
written: the default one with TE userbuffers comm kernels, and an NCCL-only one
(comm kernels named ncclDevKernel_*, which HTA recognises, kernel times on whole
µs since HTA rounds ns-resolution times to µs) on which the overlap fraction
of tptune and HTA over all steps but the last (HTA drops it) must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


GEMM_FWD = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT"
GEMM_DGRAD = "nvjet_sm90_tst_256x128_64x4_1x4_h_bz_coopA_NNT"
GEMM_WGRAD = "nvjet_sm90_tst_320x128_64x3_1x4_h_bz_coopB_NTT"
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
)
COMM = {
    "ub": (
        "void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int, int, int, int, int, int, void**, int, unsigned long)",
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, int, int, int, int, int, void**, int, unsigned long)",
    ),
    "nccl": (
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
}
PID, MAIN, AUTOGRAD = 1154, 1154, 1185
S_GEMM, S_COMM, S_MISC = 7, 20, 21


class Writer:
    """Kineto-style pretty-printed events, buffered and flushed in chunks."""

    def __init__(self, f, whole_us: bool = False):
        self.f, self.buf, self.n, self.first, self.ext, self.corr = f, [], 0, True, 1, 1
        self.whole_us = whole_us

    def _put(self, text: str):
        self.buf.append(text if self.first else ",\n" + text)
        self.first = False
        self.n += 1
        if len(self.buf) >= 20000:
            self.flush()

    def flush(self):
        self.f.write("".join(self.buf))
        self.buf = []

    def cpu(self, cat, name, tid, ts, dur, **extra):
        self.ext += 1
        more = "".join(f', "{k}": {v}' for k, v in extra.items())
        self._put(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {PID}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n'
            f'    "args": {{\n      "External id": {self.ext},"Record function id": 0{more}, "Ev Idx": {self.n}\n    }}\n  }}'
        )
        return self.ext

    def launch(self, name, tid, ts, dur, ext):
        corr = self.corr
        self.corr += 1
        self._put(
            f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": {PID}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n'
            f'    "args": {{\n      "External id": {ext},  "cbid": 211, "correlation": {corr}\n    }}\n  }}'
        )
        self._put(
            f'  {{\n    "ph": "s", "id": {corr}, "pid": {PID}, "tid": {tid}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g"\n  }}'
        )
        return corr

    def kernel(self, name, stream, ts, dur, corr, ext):
        if self.whole_us:
            ts, dur = round(ts), round(dur)
        self._put(
            f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n'
            f'    "args": {{\n      "External id": {ext},\n      "queued": 0, "device": 0, "context": 1,\n'
            f'      "stream": {stream}, "correlation": {corr},\n'
            f'      "registers per thread": 168, "shared memory": 232448,\n'
            f'      "blocks per SM": 1.000000, "warps per SM": 12.000000,\n'
            f'      "grid": [132, 1, 1], "block": [384, 1, 1],\n'
            f'      "est. achieved occupancy %": 19\n    }}\n  }}'
        )
        self._put(
            f'  {{\n    "ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}'
        )


def generate(
    path: Path, size_mb: float, comm: str = "ub", layers: int = 2000, seed: int = 0, whole_us: bool = False
) -> dict:
    """Write a synthetic trace of about size_mb MB; returns counts. whole_us:
    kernel times on whole microseconds (HTA rounds to µs; then it must agree exactly)."""
    rnd = random.Random(seed)
    ag, rs = COMM[comm]
    target = size_mb * 1e6
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
    }
    with open(path, "w") as f:
        f.write(json.dumps(header, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        w = Writer(f, whole_us)
        cpu = 4455598470000.0
        gpu = {S_GEMM: cpu, S_COMM: cpu, S_MISC: cpu}
        step = 0
        while f.tell() + sum(map(len, w.buf)) < target:
            step += 1
            step_start = cpu
            ranges = []
            # Forward: per layer AG overlapped with the GEMM, then an elementwise add.
            fwd_start = cpu = cpu + 5
            for layer in range(layers):
                exposed = layer % 3 == 0  # every third AG waits for the GEMM stream: exposed comm
                lin_start = cpu
                ext = w.ext + 1
                cpu += 3
                c = w.launch("cudaLaunchKernel", MAIN, cpu, 4, ext)
                t = max(gpu[S_COMM], cpu + 6, gpu[S_GEMM] if exposed else 0)
                d = rnd.uniform(80, 120)
                w.kernel(ag, S_COMM, t, d, c, ext)
                gpu[S_COMM] = t + d
                if exposed:
                    gpu[S_GEMM] = t + d
                cpu += 6
                mm = w.cpu("cpu_op", "aten::mm", MAIN, cpu, 12)
                c = w.launch("cudaLaunchKernel", MAIN, cpu + 2, 5, mm)
                t = max(gpu[S_GEMM], cpu + 8)
                d = rnd.uniform(200, 260)
                w.kernel(GEMM_FWD, S_GEMM, t, d, c, mm)
                gpu[S_GEMM] = t + d
                cpu += 14
                add = w.cpu("cpu_op", "aten::add", MAIN, cpu, 8)
                c = w.launch("cudaLaunchKernel", MAIN, cpu + 1, 4, add)
                t = max(gpu[S_GEMM], cpu + 6)
                w.kernel(ELEMENTWISE, S_GEMM, t, 20, c, add)
                gpu[S_GEMM] = t + 20
                cpu += 10
                ranges.append(("cpu_op", "_Linear", MAIN, lin_start, cpu - lin_start))
            ranges.append(("user_annotation", "tptune.forward", MAIN, fwd_start, cpu - fwd_start))
            # Backward on the autograd thread: dgrad GEMM with RS, then wgrad GEMM.
            bwd_start = cpu = cpu + 5
            for _ in range(layers):
                node_start = cpu
                cpu += 2
                ext = w.ext + 1
                c = w.launch("cudaLaunchKernel", AUTOGRAD, cpu, 4, ext)
                t = max(gpu[S_GEMM], cpu + 6)
                d = rnd.uniform(200, 260)
                w.kernel(GEMM_DGRAD, S_GEMM, t, d, c, ext)
                gpu[S_GEMM] = t + d
                dgrad_end = t + d
                cpu += 6
                c = w.launch("cudaLaunchKernel", AUTOGRAD, cpu, 4, ext)
                t = max(gpu[S_COMM], cpu + 6, dgrad_end - d / 2)
                dc = rnd.uniform(80, 140)
                w.kernel(rs, S_COMM, t, dc, c, ext)
                gpu[S_COMM] = t + dc
                cpu += 6
                c = w.launch("cudaLaunchKernel", AUTOGRAD, cpu, 4, ext)
                t = max(gpu[S_MISC], gpu[S_GEMM], cpu + 6)
                d = rnd.uniform(200, 260)
                w.kernel(GEMM_WGRAD, S_MISC, t, d, c, ext)
                gpu[S_MISC] = gpu[S_GEMM] = t + d
                cpu += 6
                ranges.append(("cpu_op", "_LinearBackward", AUTOGRAD, node_start + 1, cpu - node_start - 2))
                ranges.append(
                    ("cpu_op", "autograd::engine::evaluate_function: _LinearBackward", AUTOGRAD, node_start,
                     cpu - node_start)
                )
            # The step ends with a sync: the CPU waits for the GPU.
            sync_start = cpu
            cpu = max(cpu, *gpu.values()) + 5
            w.launch("cudaDeviceSynchronize", MAIN, sync_start, cpu - sync_start, 0)
            ranges.append(("user_annotation", "tptune.backward", MAIN, bwd_start, cpu - bwd_start))
            ranges.append(("user_annotation", f"ProfilerStep#{step}", MAIN, step_start, cpu - step_start + 1))
            for r in ranges:
                w.cpu(*r)
            cpu += 10
            for s in gpu:
                gpu[s] = max(gpu[s], cpu)
        w.flush()
        f.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return {"events": w.n, "steps": step, "bytes": path.stat().st_size}


def _tree_rss(root: int) -> int:
    """Summed RSS (bytes) of root and all its descendants, from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, todo = set(), [root]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, pp in parent.items() if pp == p and c not in tree]
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run_measured(cmd: list[str], env=None) -> dict:
    """Run cmd, polling the summed RSS of it and its children (worker processes included)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.02)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"wall_s": wall, "peak_rss_mb": peak / 1e6, "stdout": out.decode()}


# |comm ∩ compute| / |comm| over all kernels launched before the last
# ProfilerStep (HTA drops the last step that way), once exact, once with HTA's
# rounding to whole µs (start up, start+dur down).
TPTUNE_OVERLAP = """
import sys, polars as pl
from tptune.trace.load import load_trace
from tptune.trace.classify import merged_patterns
from tptune.trace.metrics import attributed_events
from tptune.trace.phases import step_ranges
from tptune.trace.intervals import union_length
trace = load_trace(sys.argv[1])
last_start = step_ranges(trace, merged_patterns())["s_start"].max()
t = attributed_events(trace).filter(pl.col("point") < last_start)
end = pl.col("ts") + pl.col("dur")
ts_us, dur_us = pl.col("ts") / 1000.0, pl.col("dur") / 1000.0
hta_start, hta_end = ts_us.ceil().cast(pl.Int64) * 1000, (ts_us + dur_us).floor().cast(pl.Int64) * 1000
for start, stop in ((pl.col("ts"), end), (hta_start, hta_end)):
    d = t.with_columns(start=start, end=stop, k=pl.lit(0))
    comm = d.filter(pl.col("cls") == "comm")
    comp = d.filter(pl.col("cls").is_in(["gemm", "other"]))
    c, p = union_length(comm, ["k"])["length"][0], union_length(comp, ["k"])["length"][0]
    both = union_length(pl.concat([comm, comp]), ["k"])["length"][0]
    print((c + p - both) / c)
"""

HTA_OVERLAP = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
print(df["comp_comm_overlap_pctg"].iloc[0])
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=400)
    ap.add_argument("--small", action="store_true", help="20 MB traces (quick check)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--gzip", action="store_true", help="also time a .json.gz copy")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--workers", default=None, help="TPTUNE_TRACE_WORKERS for tptune (1 = no worker processes)")
    args = ap.parse_args(argv)
    size = 20 if args.small else args.size_mb
    work = Path(args.workdir or tempfile.mkdtemp(prefix="trace_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for comm in ("ub", "nccl"):
        d = work / comm
        d.mkdir(exist_ok=True)
        path = d / "trace.rank0.json"
        t0 = time.perf_counter()
        info = generate(path, size, comm, whole_us=comm == "nccl")
        print(f"[{comm}] generated {info['bytes'] / 1e6:.0f} MB, {info['events']:,} events, {info['steps']} steps"
              f" in {time.perf_counter() - t0:.1f} s", flush=True)
        mb = info["bytes"] / 1e6
        files = [path]
        if args.gzip and comm == "ub":
            subprocess.run(["gzip", "-k", "-1", "-f", str(path)], check=True)
            files.append(path.with_suffix(".json.gz"))
        env = dict(os.environ, **({"TPTUNE_TRACE_WORKERS": args.workers} if args.workers else {}))
        for f in files:
            r = run_measured([sys.executable, "-m", "tptune.trace.cli", str(f), "--json"], env=env)
            print(f"[{comm}] tptune analyze {f.name}: {r['wall_s']:.2f} s, {mb / r['wall_s']:.0f} MB/s "
                  f"(of JSON), peak RSS {r['peak_rss_mb']:.0f} MB = {r['peak_rss_mb'] / mb:.2f}x file", flush=True)
            results[f"{comm}:{f.name}"] = r | {"mb": mb}
        if comm == "nccl":
            ours = run_measured([sys.executable, "-c", TPTUNE_OVERLAP, str(path)])
            ratio_ours, ratio_ours_us = map(float, ours["stdout"].split())
            print(f"[nccl] tptune comm overlap (all steps but the last) {100 * ratio_ours:.4f}% "
                  f"({100 * ratio_ours_us:.4f}% with HTA's µs rounding)", flush=True)
            if not args.no_hta:
                try:
                    hta = run_measured([sys.executable, "-c", HTA_OVERLAP, str(d)])
                except RuntimeError as e:
                    print(f"[nccl] HTA failed: {e}")
                    continue
                # HTA reports a percentage rounded to 2 decimals.
                pctg_hta = float(hta["stdout"].strip().splitlines()[-1])
                agree = abs(pctg_hta - 100 * ratio_ours_us) <= 0.0051
                print(f"[nccl] HTA get_comm_comp_overlap: {hta['wall_s']:.2f} s, peak RSS {hta['peak_rss_mb']:.0f} MB,"
                      f" overlap {pctg_hta:.2f}% vs tptune {100 * ratio_ours_us:.4f}% (same rounding)"
                      f" -> {'AGREE' if agree else 'DISAGREE'}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

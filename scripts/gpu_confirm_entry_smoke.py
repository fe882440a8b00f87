"""On a lent GPU machine (after bash .device/run.sh installed TE + megatron-core): tptune's training entry
(confirm.trainer) through the confirm stage's launch group (confirm.group over confirm.rank_runner), at TP 1 on
one GPU: whether the rank runner can fork launches after its imports, what a launch costs (imports once, then
init + warm-up + iterations), the GPU-timed iterations and their spread between launches, and the packed THD
input (one bin of the committed synthetic RL lengths a micro-batch). Prints one line per launch and a JSON summary; writes the launch logs to $OUT.
    python3 scripts/gpu_confirm_entry_smoke.py [launches] [layers]"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tptune.confirm.command import LAUNCH_ENV, entry_args, launcher_argv, model_args  # noqa: E402
from tptune.confirm.group import LaunchGroup  # noqa: E402
from tptune.model.spec import parse_model  # noqa: E402
import yaml  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
out = Path(os.environ.get("OUT", "/tmp/smoke"))
out.mkdir(parents=True, exist_ok=True)
raw = yaml.safe_load(open("config/models/llama3-8b.yaml"))
mc = parse_model(raw.get("model", raw), "llama3-8b", {"seq_length": 4096, "micro_batch_size": 1, "dtype": "bf16"})
base = [a for a in model_args(mc, layers=layers, tp=1, iters=20, micro_batches=4, seed=1234) if a != "--sequence-parallel"]
env = {**os.environ, **LAUNCH_ENV}
t0 = time.monotonic()
g = LaunchGroup(lambda port, q: launcher_argv(1, port) + [q, "--entry", "tptune"], env, 1)
res = []
# packed: 80 bins (one a micro-batch) of the committed synthetic RL lengths filled to 4096 by Megatron-RL's packer
from tptune.packing.spec import PackingSpec  # noqa: E402
from tptune.confirm.packed import draw_bins  # noqa: E402
spec = PackingSpec.from_dict({"lengths": "config/packing/rl-bimodal.txt", "rule": "fill", "max_token_len": 4096,
                              "seqs_per_step": 64})
packed = out / "packed.json"
packed.write_text(json.dumps({"capacity": 4096, "bins": draw_bins(spec, spec.load("."), 4096, 80)}))
for i in range(n + 1):
    kind = "packed" if i == n else "plain"
    argv = base + entry_args(seed=1234, packed=packed if kind == "packed" else None)
    r = g.run(setting=kind, round_=i, position=0, argv=argv, env=None, timeout_s=240, log_path=out / f"launch{i}.log",
              rel_to=None, iters=20, timed_from=5, timing_name="timing.json")
    d = r.to_dict()
    print(f"launch {i} {kind}: {d['status']} wall {d['wall_s']} s gpu {d['gpu_ms']} log {d['log_ms']} median "
          f"{d['median_ms']} sm {d['sm_mhz']} first iters {[round(x['ms']) for x in d['iterations'][:3]]} "
          f"loss {[x['loss'] for x in d['iterations'][:3]]} fail {d['failure']}", flush=True)
    res.append(d)
print("group mode", g.mode(), "import_s", g.import_s(), "total", round(time.monotonic() - t0, 1))
g.close()
ok = [d["gpu_ms"] for d in res[:n] if d["gpu_ms"]]
if len(ok) > 1:
    print("gpu ms spread over launches: %.3f%% (sd/mean)" % (100 * statistics.stdev(ok) / statistics.fmean(ok)))
(out / "smoke.json").write_text(json.dumps(res))

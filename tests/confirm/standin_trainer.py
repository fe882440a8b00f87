"""A stand-in for Megatron-LM on GPUs, for CPU tests of the confirm stage's orchestration: takes Megatron's
argv, prints training-log lines in the exact format of megatron/training/training.py's training_log
(megatron-core 0.19.2), nothing else. Format-true, not a GPU recording. Its iteration time depends on the
overlap flags it is given (the set's cfg file, another cfg, none) so the ratios have something to find;
STANDIN_LOSS_SHIFT (relative) shifts the loss of launches with --tp-comm-overlap, to fail the loss rule;
STANDIN_FAIL=<setting-cfg-substring> makes a launch whose cfg path contains it exit 1 with a userbuffers assert;
STANDIN_NOISE=<relative> moves each launch's times by up to that much (from its pid: launch-to-launch spread);
STANDIN_SLEEP=<s> sleeps that long before it prints (a launch a test can cut)."""
import datetime
import os
import sys
import time

argv = sys.argv[1:]
# Megatron prints the training log on the last rank only (print_rank_last); the others print nothing here.
last = int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1
if not last:
    sys.exit(0)
get = lambda flag, d=None: argv[argv.index(flag) + 1] if flag in argv else d
iters = int(get("--train-iters"))
seed = int(get("--seed"))
cfg = get("--tp-comm-overlap-cfg", "")
fail = os.environ.get("STANDIN_FAIL")
if fail and fail in cfg:
    print("[rank0]: AssertionError: userbuffers: ub_comm init failed (stand-in)", flush=True)
    sys.exit(1)
time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))
ms = 500.0 * (1 + float(os.environ.get("STANDIN_NOISE", "0")) * ((os.getpid() * 7919) % 1000 / 1000 - 0.5)) * (1.0 if not cfg else 0.97 if os.path.basename(cfg).startswith("tp_comm_overlap_cfg") else 0.985)
shift = float(os.environ.get("STANDIN_LOSS_SHIFT", "0")) if "--tp-comm-overlap" in argv else 0.0
for i in range(1, iters + 1):
    t = ms * (1 + 0.002 * ((i * 7 + seed + len(cfg)) % 5)) + (3000 if i == 1 else 0)
    loss = (11.9 - 0.05 * i) * (1 + shift)
    grad = 3.5 - 0.02 * i
    line = f" [{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    line += ' iteration {:8d}/{:8d} |'.format(i, iters)
    line += ' consumed samples: {:12d} |'.format(i * 4)
    line += ' elapsed time per iteration (ms): {:.1f} |'.format(t)
    line += f' learning rate: {1e-4:.6E} |'
    line += f' global batch size: {4:5d} |'
    line += ' {}: {:.6E} |'.format('lm loss', loss)
    line += f' loss scale: {1.0:.1f} |'
    line += f' grad norm: {grad:.3f} |'
    line += ' number of skipped iterations: {:3d} |'.format(0)
    line += ' number of nan iterations: {:3d} |'.format(0)
    print(line, flush=True)

#!/bin/bash
# On a lent GPU machine (TE bundle installed): tptune verify of a tuned TP 2 file against NVIDIA's presets,
# bare and with their recipe environment (config/gpu/verify-recipe-env.yaml), REPS sessions in a row
# (pooled by benchmarks/recipe_env.py); results in $OUT.
#   REPS=2 bash scripts/gpu_recipe_env.sh results/knobs-llama3-70b-h100x2-launcher/tp_comm_overlap_cfg.tp2.yaml
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UB_SKIPMC=1 CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cfg=$1 out=${OUT:-.}
for k in $(seq 1 "${REPS:-1}"); do
  start=$(date +%s)
  python3 -m tptune verify --model config/models/llama3-70b.yaml --tp 2 --cfg "$cfg" \
    --config config/gpu/verify-recipe-env.yaml --json "$out/verify-$k.json" --work-dir "/tmp/verify-$k" \
    2>&1 | tail -20 | tee "$out/verify-$k.txt"
  echo "session $k: $(( $(date +%s) - start )) s" | tee -a "$out/verify-$k.txt"
  tar czf "$out/verify-$k-sessions.tgz" --exclude='trace.rank*.json.gz' -C /tmp "verify-$k"
done

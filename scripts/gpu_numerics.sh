#!/bin/bash
# On a lent GPU machine (TE installed by .device-te/run.sh): the numerics check of issue 33 on Llama-3-70B
# blocks at each TP given. Every legitimate setting (no overlap, TE defaults, NVIDIA's nemo_tp4 and
# nvidia_bf16_tp2 presets, tptune's tuned file of that TP) and two deliberately mismatched pairs (NVIDIA's
# bulk-dgrad preset under tp_comm_overlap_rs_dgrad with bulk off: silent corruption; a reduce-scatter-dgrad
# yaml under Megatron's defaults: TE asserts), all in one tptune verify session per TP.
#   bash .device-te/run.sh bash scripts/gpu_numerics.sh "2:results/knobs-llama3-70b-x2/tp_comm_overlap_cfg.tp2.yaml" "4:<tuned tp4 yaml>"
# The FP8 and MoE rows of results/numerics-calibration ran the same way by hand, with a config of
#   search: {te_presets: []}, the same timing (and ops: [qkv, proj] for the MoE model):
#   tptune verify --model config/models/llama3-70b.yaml --tp 4 --dtype fp8 --cfg config/presets/nvidia_fp8_tp4.yaml
#     --cfg config/presets/nvidia_fp8_tp2.yaml --pair config/presets/nvidia_fp8_tp4.yaml config/gpu/overrides-rs-dgrad-bulk-off.yaml
#   tptune verify --model config/models/qwen3-30b-a3b.yaml --tp 2 --cfg config/presets/nvidia_bf16_tp2.yaml
#     --cfg config/presets/nemo_tp4.yaml --pair config/presets/nvidia_bf16_tp2.yaml config/gpu/overrides-rs-dgrad-bulk-off.yaml
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UB_SKIPMC=1 CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-.}
for spec in "$@"; do
  tp=${spec%%:*}; tuned=${spec#*:}
  start=$(date +%s)
  timeout -k 15 -s INT "${VERIFY_TIMEOUT:-280}" python3 -m tptune verify --model config/models/llama3-70b.yaml --tp "$tp" \
    --config config/gpu/verify-numerics.yaml --cfg "$tuned" \
    --pair config/presets/nvidia_bf16_tp2.yaml config/gpu/overrides-rs-dgrad-bulk-off.yaml \
    --pair "$tuned" config/gpu/overrides-megatron-defaults.yaml \
    --json "$out/verify-tp$tp.json" --work-dir "verify-tp$tp" > "$out/verify-tp$tp.log" 2>&1
  echo "TP $tp: exit $? after $(( $(date +%s) - start )) s"
  cat "$out/verify-tp$tp.log" | tail -15
  tar czf "$out/verify-tp$tp-sessions.tgz" --exclude='trace.rank*.json.gz' "verify-tp$tp" 2>/dev/null
  tar czf "$out/verify-tp$tp-worker-logs.tgz" $(find /tmp/tptune-pool -name 'srv-*.log' 2>/dev/null) 2>/dev/null
done

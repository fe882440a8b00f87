#!/bin/bash
# On a lent GPU machine: the layer stage on a finished run (the command its Snakemake rule runs), its
# decisions re-made with the block-level winner, then tptune verify of the resulting TP=2 yaml.
#   bash .device/run.sh bash scripts/device_layer_verify.sh <finished run folder> <run config>
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
src=$1 cfg=$2
run=outputs/$(basename "$src")
mkdir -p outputs && rm -rf "$run" && cp -r "$src" "$run"
start=$(date +%s)
python3 -m tptune layer --config "$run/config.json" --tp 2 --out "$run/layer/tp2.json" 2>&1 | tail -5
echo "layer stage: $(( $(date +%s) - start )) s"
python3 -m tptune decide --config "$run/config.json" --decisions "$run"/search/*/final.json
start=$(date +%s)
python3 -m tptune verify --model config/models/llama3-70b.yaml --tp 2 --cfg "$run/tp_comm_overlap_cfg.tp2.yaml" \
  --config "$cfg" --ops --json "${OUT:-.}/verify.json" --work-dir /tmp/verify 2>&1 | tee "${OUT:-.}/verify.txt"
echo "verify: $(( $(date +%s) - start )) s"
[ -n "${OUT:-}" ] && tar czf "$OUT/layer.tgz" --exclude='trace.rank*.json.gz' "$run/layer" "$run/sessions/layer" \
  "$run/presets" "$run/decisions.json" "$run"/tp_comm_overlap_cfg*.yaml "$run/ub_cfgs.json" \
  && tar czf "$OUT/verify-sessions.tgz" --exclude='trace.rank*.json.gz' -C /tmp verify
ls -la "${OUT:-.}"

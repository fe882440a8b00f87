#!/bin/bash
# The confirm stage (issue 46) of one committed run on a lent multi-GPU machine, in Megatron-LM's own training
# loop; confirm.json and the launch logs packed into $OUT. It works on a copy of just the files the stage reads
# (outputs/confirm-<name>, ~100 KB), so results/ (126 MB) need not travel:
#   here:       bash scripts/device_confirm.sh --prepare results/tp24-llama3-70b-h200x4/rep1
#               bash scripts/device_tree.sh lean          # results/ out of what travels (restore before committing)
#   device run: command  bash .device-te1/run.sh bash scripts/device_confirm.sh outputs/confirm-tp24-llama3-70b-h200x4-rep1 [rounds] [layers]
#               carry    [".device-te1", "outputs/confirm-tp24-llama3-70b-h200x4-rep1"]
# rounds default 3, layers default 2 (give "auto" for as many as fit, at most 4). CONFIRM_ARGS="--iters 20": more
# `tptune confirm` options. Runs `python3 -m tptune.confirm`, which needs neither polars nor snakemake: the bundle
# run.sh installs (TE, megatron-core) and the machine's torch and pyyaml are all it imports.
set -u
cd "$(dirname "$0")/.."
prepare() {   # prepare <run folder>: the stage's inputs copied to outputs/confirm-<name>; prints that folder
  local src=${1%/} name dst
  name=$(echo "$src" | sed 's#^results/##; s#/#-#g')
  dst=outputs/confirm-$name
  rm -rf "$dst" && mkdir -p "$dst"
  (cd "$src" && cp -r decisions.json model.json config.json layer presets megatron_flags*.txt tp_comm_overlap_cfg*.yaml \
     "$OLDPWD/$dst/") || { echo "device_confirm.sh: $src lacks a file the stage reads" >&2; exit 2; }
  echo "$dst"
}
if [ "${1:-}" = "--prepare" ]; then
  dst=$(prepare "${2:?usage: device_confirm.sh --prepare <run folder>}") || exit 2
  echo "prepared $dst ($(du -sh "$dst" | cut -f1)): carry it beside .device-te1"
  exit 0
fi
source scripts/device_env.sh
run=${1:?usage: device_confirm.sh <run folder> [rounds] [layers]}
rounds=${2:-3}
layers=${3:-2}
case "$run" in outputs/confirm-*) ;; *) run=$(prepare "$run") || exit 2 ;; esac
python3 -c "import transformer_engine.pytorch, megatron.core, megatron.training" \
  || { echo "device_confirm.sh: TE / megatron.training missing: bash .device-te1/run.sh installs them" >&2; exit 3; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
layer_arg="--layers $layers"; [ "$layers" = auto ] && layer_arg=""
start=$(date +%s)
python3 -m tptune.confirm "$run" --rounds "$rounds" $layer_arg --exit-zero ${CONFIRM_ARGS:-}
rc=$?
echo "device_confirm.sh: tptune confirm exit $rc after $(( $(date +%s) - start )) s"
if [ -n "${OUT:-}" ]; then
  base=$(basename "$run")
  tar czf "$OUT/$base.tgz" -C outputs "$base/confirm.json" "$base/confirm" 2>/dev/null
  cp "$run/confirm.json" "$OUT/" 2>/dev/null
  ls -la "$OUT"
fi
exit $rc

#!/bin/bash
# On a lent GPU machine: measure the layer stage of a run whose op searches are recorded but whose block
# session was cut (a lease's timeout), then re-derive its decisions, files and report and pack it into
# $OUT like device_workflow.sh. Copy the committed folder to outputs/<its run name> here and carry it:
#   bash .device/run.sh bash scripts/device_finish_layer.sh outputs/<run> 4 [more TPs]
#   RUN_TIMEOUT=300: stop the block session after that many seconds (what it measured comes back, and
#   the same call made again resumes it from its session.partial.json)
# It calls the layer rule's command directly: Snakemake, finding the carried report newer than nothing it
# tracks, does not schedule a layer stage that the report lacks.
set -u
source "$(dirname "$0")/device_env.sh"
run_dir=${1:?usage: device_finish_layer.sh outputs/<run> TP [TP ...]}; shift
run=$(basename "$run_dir")
[ -f "$run_dir/config.json" ] || { echo "$run_dir: no config.json (not a run folder)" >&2; exit 2; }
find "$run_dir" -name '*.lock' -delete
start=$(date +%s)
for tp in "$@"; do
  timeout -k 15 -s INT "${RUN_TIMEOUT:-0}" tptune layer --config "$run_dir/config.json" --tp "$tp" \
    --out "$run_dir/layer/tp$tp.json" > "outputs-$run.log" 2>&1
  echo "$run_dir TP $tp: layer exit $? after $(( $(date +%s) - start )) s"
done
{ tptune rederive "$run_dir" && tptune check-run "$run_dir" --out "$run_dir/status.json"; } >> "outputs-$run.log" 2>&1
echo "$run_dir: rederive + check-run exit $?"
tail -3 "outputs-$run.log"
echo "$(( $(date +%s) - start ))" > "$run_dir/layer_wall_s.txt"
pack_run "$(dirname "$run_dir")" "$run"
exit 0

#!/bin/bash
# Re-derive a finished run's search results, TP decisions, configs and report from its recorded
# measurements (run.json + analysis), with this checkout's decision code; no GPU needed.
#   bash scripts/rederive_decisions.sh outputs/<run>
set -euo pipefail
run=$1
cfg=$run/config.json
ops=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['ops']))" "$cfg")
for op in $ops; do
  points=()
  for d in "$run"/search/"$op"/tp*/; do
    tp=${d%/}; tp=${tp##*/tp}
    [ -f "$d/results.json" ] || continue
    tptune tp-point --config "$cfg" --op "$op" --tp "$tp" --out "$d/point.json"
    points+=("$d/point.json")
    tptune tp-step --config "$cfg" --op "$op" --tp "$tp" --points "${points[@]}" --out "$d/decision.json"
    last=$d/decision.json
  done
  cp "$last" "$run/search/$op/final.json"
done
tptune decide --config "$cfg" --decisions "$run"/search/*/final.json
tptune report --config "$cfg" --out "$run/report.md"
echo "re-derived $run"

#!/bin/bash
# Re-derive every committed tuning run (results/**/ with config.json, decisions.json and sessions/) in a
# scratch copy with this checkout's code and list every text file that comes out different from the
# committed one. Used to prove a refactor leaves behaviour unchanged: no output means identical.
#   bash scripts/rederive_all.sh [scratch-dir]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-$(mktemp -d)}
status=0
rm -rf "$scratch/results"; mkdir -p "$scratch"; cp -r "$root/results" "$scratch/results"   # pooled figures read sibling runs
while read -r cfg; do
  run=$(dirname "$cfg")
  [ -d "$run/sessions" ] && [ -f "$run/decisions.json" ] || continue
  rel=${run#"$root/"}
  dst="$scratch/$rel"
  if ! (cd "$root" && tptune rederive "$dst" >"$dst.log" 2>&1); then
    echo "FAILED $rel (see $dst.log)"; status=1; continue
  fi
  # text files only; figures are re-drawn by matplotlib and not compared byte for byte
  out=$(diff -rq --exclude='*.png' --exclude='*.parquet' --exclude='*.svg' "$run" "$dst")
  if [ -n "$out" ]; then echo "$out" | sed "s#$scratch/##"; status=1; fi
done < <(find "$root/results" -name config.json | sort)
exit $status

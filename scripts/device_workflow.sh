#!/bin/bash
# On a lent GPU machine (after bash .device/run.sh installed TE and the .device/py wheels): run the
# workflow for each config given, REPS times in a row (fresh output folders <run>-rep<k> when REPS > 1),
# then pack each run's small results into $OUT.
#   [REPS=3] bash .device/run.sh bash scripts/device_workflow.sh config/gpu/a.yaml [config/gpu/b.yaml ...]
#   RUN_TIMEOUT=300: stop a run after that many seconds (its files still come back)
#   EXTRA_CONFIG=config/gpu/no-layer.yaml: more --configfile(s) over each config, space-separated (e.g. no
#   layer stage)
#   REP_LIST="2 3": only those repetitions (named -rep<k>), e.g. the rest of a series begun in an earlier call
#   SNAKEMAKE_ARGS="--rerun-triggers input": extra snakemake options; a session the timeout stopped on
#   this machine resumes from its session.partial.json when the same call is made again. A committed run
#   whose layer stage was cut: scripts/device_finish_layer.sh
#   Carrying: the working tree plus what one call carries must stay under 64 MiB, and results/ alone is
#   ~60 MB: run `bash scripts/device_tree.sh lean` first (results/ out of what travels), install the bundle
#   in consecutive calls on one warm machine (carry .device-te1 + .device-py, then .device-polars), run this
#   script, then `bash scripts/device_tree.sh restore` before committing anything.
set -u
source "$(dirname "$0")/device_env.sh"
ngpu=$(ls /proc/driver/nvidia/gpus | wc -l)
reps=${REPS:-1}
replist=${REP_LIST:-$(seq 1 "$reps")}
[ -n "${REP_LIST:-}" ] && reps=2   # named -rep<k>
for cfg in "$@"; do
  base=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['run'])" "$cfg")
  for k in $replist; do
    run=$base; [ "$reps" -gt 1 ] && run=$base-rep$k
    start=$(date +%s)
    timeout -k 15 -s INT "${RUN_TIMEOUT:-0}" python3 -m snakemake --cores 16 --resources gpus=$ngpu --configfile "$cfg" ${EXTRA_CONFIG:-} --config run="$run" \
      --keep-going ${SNAKEMAKE_ARGS:-} > "outputs-$run.log" 2>&1
    echo "$cfg -> $run: snakemake exit $? after $(( $(date +%s) - start )) s"
    tail -3 "outputs-$run.log"
    echo "$(( $(date +%s) - start ))" > "outputs/$run/wall_s.txt"
    tptune predict "outputs/$run" --gpus 8 || echo "$run: no 8-GPU prediction"   # wall_s.8gpu-predicted.txt beside it
    pack_run outputs "$run" && [ -n "${OUT:-}" ] \
      && tar czf "$OUT/$run-worker-logs.tgz" $(find /tmp/tptune-pool -name 'srv-*.log' 2>/dev/null) 2>/dev/null
  done
  # rank-0 traces of the last run's TP-point references, for fixtures
  [ -n "${OUT:-}" ] && (cd outputs && ls $run/sessions/*/tp*/point/{none,nocomm,ub.te}/trace.rank0.json.gz 2>/dev/null \
    | tar czf "$OUT/$run-traces.tgz" -T -)
done
ls -la "${OUT:-.}"

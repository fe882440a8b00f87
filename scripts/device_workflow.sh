#!/bin/bash
# On a lent GPU machine (after bash .device/run.sh installed TE and the .device/py wheels): run the
# workflow for each config given, then pack each run's small results into $OUT.
#   bash .device/run.sh bash scripts/device_workflow.sh config/gpu/a.yaml [config/gpu/b.yaml ...]
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p /tmp/tptune-bin
printf '#!/bin/sh\nexec python3 -m tptune "$@"\n' > /tmp/tptune-bin/tptune && chmod +x /tmp/tptune-bin/tptune
export PATH="/tmp/tptune-bin:$PATH"
ngpu=$(ls /proc/driver/nvidia/gpus | wc -l)
for cfg in "$@"; do
  run=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['run'])" "$cfg")
  start=$(date +%s)
  python3 -m snakemake --cores 16 --resources gpus=$ngpu --configfile "$cfg" --keep-going > "outputs-$run.log" 2>&1
  echo "$cfg: snakemake exit $? after $(( $(date +%s) - start )) s"
  tail -3 "outputs-$run.log"
  d=outputs/$run
  [ -n "${OUT:-}" ] && tar czf "$OUT/$run.tgz" -C outputs --exclude='*.rank[1-9].json.gz' --exclude='trace.rank0.json.gz' \
      "$run" && cp "outputs-$run.log" "$OUT/" 2>/dev/null
  # rank-0 traces of the references, for fixtures
  [ -n "${OUT:-}" ] && (cd outputs && ls $run/cases/*/tp*/{none,nocomm,ub.te,ub.nemo_tp4}/trace.rank0.json.gz 2>/dev/null | tar czf "$OUT/$run-traces.tgz" -T -)
done
ls -la "${OUT:-.}"

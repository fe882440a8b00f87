# Sourced by the device scripts: what every process on a lent GPU machine runs with.
# NVLink multicast off (required on the lent machines), whether or not the caller runs under run.sh.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UB_SKIPMC=1 CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p /tmp/tptune-bin
printf '#!/bin/sh\nexec python3 -m tptune "$@"\n' > /tmp/tptune-bin/tptune && chmod +x /tmp/tptune-bin/tptune
export PATH="/tmp/tptune-bin:$PATH"

# pack_run <parent> <run>: the run folder's small files (no profiler traces) and its log into $OUT, if set
pack_run() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/$2.tgz" -C "$1" --exclude='trace.rank*.json.gz' "$2" && cp "outputs-$2.log" "$OUT/" 2>/dev/null
}

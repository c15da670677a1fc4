#!/usr/bin/env bash
# The whole GPU tier (colossalai-gemini, deepspeed, fsdp) as one command on a GPU machine, from the
# wheelhouse: `bash tools/gpu/tier.sh [PACKAGE...]` (default: all three, each split in streams, below).
#
# PACKAGE may carry its own time limit in seconds, `deepspeed=300`; the default is TIER_LIMIT_S (480; side by
# side the slowest stream took 408 s on 2 GPUs), so one hang cannot eat the whole call. A pytest -k expression
# after a colon runs part of a package's tier, `deepspeed=200:resume or nodes`, to re-check a fix without paying
# for the rest; a package may be named twice with two selections, to run its halves side by side. A test gets
# TIER_TEST_TIMEOUT_S (240; pytest-timeout is in the GPU image) and fails with its traceback instead of
# silencing the tests after it. A module's shared launch counts against its first test, which may carry a longer
# limit of its own (deepspeed's one-GPU launch). Logs and a summary go to $OUT as they are written, so a killed
# call still returns them; at the end the logs are packed into $OUT/logs.tar.gz.
#
# JIT-built kernels come and go as one archive, so a fresh machine loads them instead of spending
# minutes compiling: setup.sh unpacks `.kernels/kernels.tar.gz.part-*` beside the checkout (name
# `.kernels` in the device tool's carry), and the cache is packed again into $OUT afterwards, in parts
# of 15 MiB (the device tool returns files of at most 16 MiB).
set -uo pipefail
tier_start=$(date +%s)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$repo/.gpu-tier}
mkdir -p "$out"
source "$repo/tools/gpu/setup.sh" || exit 1
set +e  # setup.sh sets -e; every package runs even when one fails
cd "$repo"

packages=("$@")
# By default each package runs as two to four streams side by side: its Hugging Face cases (one launch per
# name, transformers imported in every process), its several-GPU and two-node tests, and the rest. Whole
# packages one stream each took over 9 minutes on 4 GPUs, more than one call of the device tool allows.
if [ ${#packages[@]} -eq 0 ]; then
  packages=(
    "fsdp:hugging" "fsdp:not hugging"
    "deepspeed:hugging" "deepspeed:not hugging"
    "colossalai-gemini:hugging" "colossalai-gemini:several or multinode or checkpoint"
    # The cross-strategy matrix alone took 388 s on two GPUs (four launches): a stream of its own.
    "colossalai-gemini=520:cross_strategy"
    "colossalai-gemini:not (hugging or several or multinode or checkpoint or cross_strategy)"
  )
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/summary.txt"

log_name() {  # ITEM -> the log's file name: the package, and the selection where there is one
  local item=$1 select=""
  if [[ $item == *:* ]]; then select=${item#*:}; fi
  item=${item%%[=:]*}
  echo "$item${select:+-$(printf '%s' "$select" | tr -c 'A-Za-z0-9_' '_')}"
}

run_package() {  # ITEM: PACKAGE[=LIMIT][:K_EXPR]; writes $out/<log_name>.log and a summary line
  local item=$1 select="" package limit start code counts log
  log="$out/$(log_name "$1").log"
  if [[ $item == *:* ]]; then select=${item#*:}; item=${item%%:*}; fi
  package=${item%%=*}
  limit=${item#*=}
  [ "$limit" != "$item" ] || limit=${TIER_LIMIT_S:-480}
  start=$(date +%s)
  # SIGINT, not TERM: pytest then prints the failures it has seen, which a cut call would lose.
  timeout -s INT -k 30 "$limit" python -m pytest "packages/$package/tests" -m gpu -v -rfEsx --durations=8 \
    --timeout="${TIER_TEST_TIMEOUT_S:-240}" -p no:cacheprovider ${select:+-k "$select"} >"$log" 2>&1
  code=$?
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error)" "$log" | tail -1)
  echo "$(log_name "$1"): exit $code in $(( $(date +%s) - start )) s: ${counts:-no result (time limit?)}" >>"$out/summary.txt"
  return "$code"
}

# The packages run side by side: their tests use tiny models, so the GPUs, 32 cores and host memory have
# room for all three, and the tier takes as long as its slowest package instead of the sum. Every launch
# takes a free port, so the packages' rendezvous do not meet. TIER_PARALLEL=0 runs them one after another.
status=0
pids=()
for item in "${packages[@]}"; do
  if [ "${TIER_PARALLEL:-1}" = 1 ]; then
    run_package "$item" & pids+=($!)
  else
    run_package "$item" || status=1
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for item in "${packages[@]}"; do
  echo "===== $(log_name "$item")"
  cat "$out/$(log_name "$item").log"
done
echo "tier: whole command in $(( $(date +%s) - tier_start )) s, the wheelhouse install included" | tee -a "$out/summary.txt"
# The device tool returns at most 8 files from $OUT: the streams' logs (8 by default) travel back as one archive
# beside summary.txt and the kernel cache's parts. A call cut short leaves them one by one, as they were written.
logs=()
for item in "${packages[@]}"; do logs+=("$(log_name "$item").log"); done
tar -czf "$out/logs.tar.gz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
pack_kernel_cache "$out"
cat "$out/summary.txt"
exit $status

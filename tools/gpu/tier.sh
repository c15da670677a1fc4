#!/usr/bin/env bash
# The whole GPU tier (colossalai-gemini, deepspeed, fsdp) as one command on a GPU machine, from the
# wheelhouse: `bash tools/gpu/tier.sh [PACKAGE...]` (default: all three).
#
# PACKAGE may carry its own time limit in seconds, `deepspeed=300`; the default is TIER_LIMIT_S
# (240), so one hang cannot eat the whole call. A pytest -k expression after a colon runs part of a
# package's tier, `deepspeed=200:resume or nodes`, to re-check a fix without paying for the rest. A test gets TIER_TEST_TIMEOUT_S (180; pytest-timeout
# is in the GPU image) and fails with its traceback instead of silencing the tests after it. Logs
# and a summary go to $OUT as they are written, so a killed call still returns them.
#
# JIT-built kernels come and go as one archive, so a fresh machine loads them instead of spending
# minutes compiling: `.kernels/kernels.tar.gz.part-*` beside the checkout (name `.kernels` in the
# device tool's carry) is unpacked before the tests, and the cache is packed again into $OUT
# afterwards, in parts of 15 MiB (the device tool returns files of at most 16 MiB).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$repo/.gpu-tier}
mkdir -p "$out"
source "$repo/tools/gpu/setup.sh" || exit 1
set +e  # setup.sh sets -e; every package runs even when one fails
cd "$repo"

kernels=(/tmp/cache/torch_extensions /tmp/cache/colossalai)
if compgen -G ".kernels/kernels.tar.gz.part-*" >/dev/null; then
  cat .kernels/kernels.tar.gz.part-* | tar -xzPf - && echo "tier: unpacked the carried kernel cache"
  # The wheels were just installed, so their sources are newer than the carried objects; ninja
  # would rebuild them all. The objects were built from these exact wheels: mark them current.
  find "${kernels[@]}" -exec touch {} + 2>/dev/null
fi

packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(fsdp colossalai-gemini deepspeed)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/summary.txt"
status=0
for item in "${packages[@]}"; do
  select=""
  if [[ $item == *:* ]]; then select=${item#*:}; item=${item%%:*}; fi
  package=${item%%=*}
  limit=${item#*=}
  [ "$limit" != "$item" ] || limit=${TIER_LIMIT_S:-240}
  start=$(date +%s)
  # SIGINT, not TERM: pytest then prints the failures it has seen, which a cut call would lose.
  timeout -s INT -k 30 "$limit" python -m pytest "packages/$package/tests" -m gpu -v -rfEsx --durations=8 \
    --timeout="${TIER_TEST_TIMEOUT_S:-180}" -p no:cacheprovider ${select:+-k "$select"} 2>&1 | tee "$out/$package.log"
  code=${PIPESTATUS[0]}
  [ "$code" -eq 0 ] || status=1
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error)" "$out/$package.log" | tail -1)
  echo "$package: exit $code in $(( $(date +%s) - start )) s: ${counts:-no result (time limit?)}" | tee -a "$out/summary.txt"
  rm -f "$out"/kernels.tar.gz.part-*
  tar -czPf - "${kernels[@]}" 2>/dev/null | split -b 15m - "$out/kernels.tar.gz.part-"
done
cat "$out/summary.txt"
exit $status

#!/usr/bin/env bash
# Issue #16 item 4's drop-in benchmark as one command on one GPU, from the wheelhouse:
#
#   bash tools/benchmark/dropin.sh                       # preset "dropin": fsdp, deepspeed_stage_2, colossalai_cuda
#   bash tools/benchmark/dropin.sh colossalai_variants   # what steadies colossalai (each variant vs the plain run)
#   bash tools/benchmark/dropin.sh hand:gemini_cuda,trainer:colossalai_cuda --repeats-gemini 5
#   bash tools/benchmark/dropin.sh hand:gemini_cuda,trainer:colossalai_cuda --batch-size 16 --no-checkpoint
#       # ColossalAI where the GPU, not the host, bounds a step (docs/benchmarks.md, "The answer so far")
#
# GPT 1.3B, bf16, 8 x 1024 tokens, 4 warm-up + 10 timed steps; every run saves a checkpoint after its
# last step; each run is repeated (3 times, ColossalAI's 5), interleaved round by round. Arguments
# after the first go to `python -m tools.benchmark run` and override these defaults.
#
# DROPIN_WALL_S (default 520) bounds the whole call, installing the wheels included: the session gets
# what is left of it, a run starts only when its earlier repeats say it would end in time, and no
# run gets more than DROPIN_TIMEOUT_S (200) or what is left. Results, the
# summary with medians, spreads and ratios, its markdown table and one log per run are written to
# $OUT as each run ends, so a call killed at its time limit still returns everything measured.
#
# A kernel cache carried as `.kernels/kernels.tar.gz.part-*` (made by tools/gpu/tier.sh) is unpacked by
# tools/gpu/setup.sh, so DeepSpeed's FusedAdam and ColossalAI's HybridAdam are loaded rather than compiled.
set -uo pipefail
SECONDS=0  # the call's wall time so far, setup included
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$repo/.benchmark-dropin}
mkdir -p "$out"
source "$repo/tools/gpu/setup.sh" || exit 1
set +e  # setup.sh sets -e; the harness records failed runs itself
cd "$repo"
export PYTHONUNBUFFERED=1


what=${1:-dropin}
shift $(( $# > 0 ? 1 : 0 ))
if [[ $what == *:* ]]; then selection=(--runs "$what"); else selection=(--preset "$what"); fi
label=dropin-$(printf '%s' "$what" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-60)  # the device tool returns plain names only

# A 1.3B model's checkpoint with its Adam states is about 16 GB; memory-backed /dev/shm writes it
# in seconds where a disk may take a minute. Each run's folder is deleted when the run ends.
shm_kib=$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)
if [ "${shm_kib:-0}" -gt $(( 48 * 1024 * 1024 )) ]; then
  checkpoints=/dev/shm/benchmark-checkpoints
else
  checkpoints=${TMPDIR:-/tmp}/benchmark-checkpoints
fi
budget=$(( ${DROPIN_WALL_S:-520} - SECONDS - 15 ))  # 15 s: the harness's start and the clean-up after
echo "dropin: $what, checkpoints under $checkpoints, results in $out, $budget s for the runs"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

python -m tools.benchmark run "${selection[@]}" --size 1.3b --batch-size 8 --length 1024 \
  --warmup-steps 4 --timed-steps 10 --repeats 3 --repeats-gemini 5 \
  --timeout "${DROPIN_TIMEOUT_S:-200}" --budget "$budget" \
  --checkpoint-dir "$checkpoints" --out "$out" --logs "$out/logs" --label "$label" "$@" 2>&1 \
  | tee "$out/$label.log"
status=${PIPESTATUS[0]}
rm -rf "$checkpoints"
exit "$status"

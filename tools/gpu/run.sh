#!/usr/bin/env bash
# Runs one command on the GPU machine with the carried wheels installed (installing them first if
# needed), e.g. `bash tools/gpu/run.sh python -m pytest packages/deepspeed/tests -m gpu`.
# With OUT set (the device tool sets it), the output is also kept as $OUT/<name>.log, where
# <name> is $LOG_NAME or the command made file-safe; only a few files come back from $OUT.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: tools/gpu/run.sh COMMAND [ARGUMENTS...]" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1  # so a command killed at the time limit still leaves its output

if [ -z "${OUT:-}" ]; then
  exec "$@"
fi
name=${LOG_NAME:-$(printf '%s' "$*" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-80)}
"$@" 2>&1 | tee -a "$OUT/$name.log"

#!/usr/bin/env bash
# Builds every wheel the offline GPU machine needs into one folder (default: .whl at the repo root).
# That machine has Python 3.12, torch, Lightning, transformers, peft, ninja and nvcc, but no network,
# no deepspeed, no colossalai and no hatchling: everything else travels as wheels, 64 MiB a call.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/.whl}" && cd "${1:-$repo/.whl}" && pwd)
pip=(python3 -m pip --disable-pip-version-check)

# Pinned so that a rebuild carries what was checked; pydantic pins its pydantic-core exactly.
# Everything else deepspeed and colossalai import (numpy, psutil, einops, rich, msgpack, py-cpuinfo,
# packaging, tqdm, safetensors, nvidia-ml-py, peft, transformers) is already in the GPU image.
sdists=(deepspeed==0.19.8 colossalai==0.5.0 contexttimer==0.3.3)
binaries=(
  hjson==3.1.0
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  # pydantic 2.14 needs typing-extensions>=4.16; the image's own may be older.
  typing-extensions==4.16.0
  # colossalai's optimizer package imports galore_torch, which imports bitsandbytes.
  galore-torch==1.0 bitsandbytes==0.50.2
  # LightningCLI, for each package's CLI test (the image has PyYAML).
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0
  # float8 training, which users opt into in configure_model (torchao 0.18 needs torch>=2.11, the image's).
  torchao==0.18.0
)

rm -f "$out"/*.whl  # one version of each: two versions of one package stop the whole install

# Our own packages: the image has no hatchling, and entry points exist only in an installed wheel.
"${pip[@]}" wheel -q --no-deps -w "$out" "$repo"/packages/*/
# The commit they were built from, for the GPU machine's benchmark records (setup.sh exports it): the copy of the
# tree that machine gets may come with a .git that is not this one's.
commit=$(git -C "$repo" rev-parse --short HEAD)
[ -z "$(git -C "$repo" status --porcelain -- packages)" ] || commit="$commit-dirty"
echo "$commit" >"$out/COMMIT"

# No compiled ops at build time: both JIT-build their kernels on the GPU machine on first use.
DS_BUILD_OPS=0 BUILD_EXT=0 "${pip[@]}" wheel -q --no-deps -w "$out" "${sdists[@]}"

# manylinux_2_24 is listed because bitsandbytes publishes only that tag (pip matches tags exactly).
"${pip[@]}" download -q --no-deps --only-binary=:all: -d "$out" \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  "${binaries[@]}"

python3 "$repo/tools/wheelhouse/slim_bitsandbytes.py" "$out"/bitsandbytes-*.whl

# The GPU image lacks libaio, which DeepSpeed's NVMe offload (deepspeed_stage_3_offload_nvme) builds its async_io
# op against. This machine's runtime library and header travel beside the wheels; setup.sh puts them on the
# compiler's and the loader's paths where the image has none. It depends on glibc alone.
rm -rf "$out/libaio"
# Ubuntu 24.04 names the library libaio.so.1t64; `|| true`: awk stops reading early, and pipefail would end the script.
library=$( (ldconfig -p | awk '/libaio\.so\.1(t64)? .*x86-64/ {print $NF; exit}') || true)
if [ -n "$library" ] && [ -e /usr/include/libaio.h ]; then
  mkdir -p "$out/libaio"
  cp -L "$library" "$out/libaio/libaio.so.1"
  cp /usr/include/libaio.h "$out/libaio/"
else
  echo "build.sh: no libaio here (apt-get install libaio-dev): NVMe offload will fail on a GPU image without it" >&2
fi

ls -l "$out"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
du -cb "$out"/*.whl | awk 'END {printf "total: %.1f MiB in %s\n", $1 / 1048576, "'"$out"'"}'

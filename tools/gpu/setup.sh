#!/usr/bin/env bash
# Installs the carried wheels (.whl, made by tools/wheelhouse/build.sh) on the offline GPU machine.
# Run it, or source it to get the environment: PATH starts with /tmp/venv/bin, PYTHONPATH=/tmp/site.
# Everything lives under /tmp, which lasts while the machine stays warm, so chained calls skip the
# install when the wheels have not changed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
wheels=("$repo"/.whl/*.whl)
[ -e "${wheels[0]}" ] || { echo "setup.sh: no wheels in $repo/.whl: run tools/wheelhouse/build.sh here and name .whl in carry" >&2; return 1 2>/dev/null || exit 1; }

site=/tmp/site
venv=/tmp/venv
# The image's python3, even when a previous source already put the venv first on PATH.
image_python=$(PATH=${PATH#"$venv/bin:"} command -v python3)
stamp=$(cat "${wheels[@]}" | sha256sum | cut -c1-16)

if [ "$(cat "$venv/.wheelhouse-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "setup.sh: installing ${#wheels[@]} wheels into $site and $venv"
  rm -rf "$site" "$venv"
  # The plain way (shared/gpu.md): image python3 + PYTHONPATH. Python does not run .pth files
  # from a --target folder, so start-up activation needs the venv below.
  "$image_python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[@]}"
  # The image's python3 is itself a venv, whose packages a --system-site-packages venv does not
  # see (that means the base interpreter's); a .pth that adds the image's site-packages does.
  # Its name sorts before lightning_strategies_autoload.pth, so torch and Lightning are there first.
  "$image_python" -m venv --system-site-packages --without-pip "$venv"
  venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$image_python" - "$venv_site/_image_site_packages.pth" <<'PY'
import site, sys
lines = [f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages()]
open(sys.argv[1], "w").writelines(lines)
PY
  "$image_python" -m pip --python "$venv/bin/python" install -q --no-index --no-deps --no-compile "${wheels[@]}"
  # ninja rebuilds a kernel whose sources are newer than its objects, and installing gives the backends'
  # kernel sources the install time: a carried cache would be rebuilt on every fresh machine (ColossalAI
  # logged 31 and 45 s to "load" its two). Dated back, the carried objects are current.
  find "$site" "$venv_site" \( -path '*/colossalai/kernel/*' -o -path '*/deepspeed/ops/*' \) -type f \
    -exec touch -d 2000-01-01 {} +
  echo "$stamp" > "$venv/.wheelhouse-stamp"
  show_versions=1
fi

export PATH="$venv/bin:$PATH" PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
# Benchmark records name the commit the installed packages were built from (tools/benchmark/environment.py).
if [ -z "${BENCHMARK_GIT_COMMIT:-}" ] && [ -e "$repo/.whl/COMMIT" ]; then
  export BENCHMARK_GIT_COMMIT=$(cat "$repo/.whl/COMMIT")
fi
# JIT-built kernels (DeepSpeed's through torch, ColossalAI's under ~/.cache/colossalai) are kept
# under /tmp so that they survive exactly as long as the installed wheels.
export TORCH_EXTENSIONS_DIR=/tmp/cache/torch_extensions
mkdir -p "$TORCH_EXTENSIONS_DIR" /tmp/cache/colossalai "$HOME/.cache"
[ -e "$HOME/.cache/colossalai" ] || ln -s /tmp/cache/colossalai "$HOME/.cache/colossalai"
# A kernel cache carried as `.kernels/kernels.tar.gz.part-*` (tier.sh packs it into $OUT) is unpacked once
# per install, so every command here loads DeepSpeed's and ColossalAI's kernels instead of compiling
# them: a compile also runs nvcc beside the training and adds its memory to what a benchmark measures.
kernel_caches=(/tmp/cache/torch_extensions /tmp/cache/colossalai)
if compgen -G "$repo/.kernels/kernels.tar.gz.part-*" >/dev/null && [ ! -e /tmp/cache/.unpacked-$stamp ]; then
  # tar keeps the objects' own times: ninja's log of dependencies records them, and an object touched since
  # counts as out of date (it was, when an earlier setup.sh touched the whole cache).
  if cat "$repo"/.kernels/kernels.tar.gz.part-* | tar -xzPf -; then
    # A lock packed by an older tier.sh would make every rank wait for a build that never runs.
    find "${kernel_caches[@]}" -name lock -type f -delete 2>/dev/null || true
    touch /tmp/cache/.unpacked-$stamp
    echo "setup.sh: unpacked the carried kernel cache"
  else
    # A part missing or cut short: objects half written must not pass for current, so build afresh.
    echo "setup.sh: the carried kernel cache did not unpack; the kernels will be built on first use" >&2
    find "${kernel_caches[@]}" -mindepth 1 -delete 2>/dev/null || true
  fi
fi

# libaio carried by build.sh, for DeepSpeed's async_io op (NVMe offload), where the image lacks its header: gcc finds
# the header and library through CPATH and LIBRARY_PATH (DeepSpeed's check compiles a call to it, its JIT build links
# -laio), the loader through LD_LIBRARY_PATH.
if [ -e "$repo/.whl/libaio/libaio.so.1" ] && [ ! -e /usr/include/libaio.h ]; then
  mkdir -p /tmp/libaio
  cp "$repo/.whl/libaio/libaio.so.1" "$repo/.whl/libaio/libaio.h" /tmp/libaio/
  ln -sf libaio.so.1 /tmp/libaio/libaio.so
  export CPATH="/tmp/libaio${CPATH:+:$CPATH}" LIBRARY_PATH="/tmp/libaio${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="/tmp/libaio${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# Packs the kernel cache into DIR in parts the device tool returns (16 MiB at most), to carry as `.kernels`.
# Lock files are left out: one left behind would make every rank of the next machine wait for it forever.
pack_kernel_cache() {
  rm -f "$1"/kernels.tar.gz.part-*
  tar --exclude='*/lock' -czPf - "${kernel_caches[@]}" 2>/dev/null | split -b 15m - "$1/kernels.tar.gz.part-"
}

# Versions after an install, and whenever the script is run rather than sourced.
if [ -n "${show_versions:-}" ] || [ "${BASH_SOURCE[0]}" = "$0" ]; then
  python - <<'PY'
import importlib, importlib.metadata as metadata, sys
# Read first: the .pth start-up hook has run only if this module is already imported.
hook_ran = "_lightning_strategies_autoload" in sys.modules
import torch
print(f"python {sys.version.split()[0]} at {sys.executable}")
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, devices {torch.cuda.device_count()}:",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none")
failed = []
checks = [("lightning", "__version__"), ("pytorch_lightning", "__version__"), ("deepspeed", "__version__"),
          ("colossalai", "__version__"), ("colossalai.booster.plugin", "GeminiPlugin")]
for module, attribute in checks:
    try:
        print(module, getattr(importlib.import_module(module), attribute))
    except Exception as error:  # every import is tried, so one report names all the broken ones
        failed.append(module)
        print(f"{module} FAILED: {type(error).__name__}: {error}")
# Each is found twice (/tmp/site and the venv hold the same wheels): list each name once.
for dist in sorted({d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("lightning-strategies")}):
    print(f"{dist} {metadata.version(dist)}")
from lightning.pytorch.strategies import StrategyRegistry
print(f"start-up hook ran: {hook_ran}; 'colossalai' in Lightning's registry: {'colossalai' in StrategyRegistry}")
raise SystemExit(1 if failed else 0)
PY
fi

#!/usr/bin/env bash
# Compile the torch binding of the one kernel tree for the other CPU families' variants.
#
# Why: `make test-cross` runs the algorithms (csrc/cpu, csrc/arch) under qemu through the
# torch-free driver, but the torch layer (csrc/torch) can only be linked on the target,
# against its own torch. This checks, without the hardware, that every binding source
# compiles to object code with each variant's flags (glowlm_kernels.build.VARIANTS) and
# the host torch's headers (the same headers on every architecture).
#
# Needs the Debian cross compilers (apt-get install g++-aarch64-linux-gnu
# g++-s390x-linux-gnu); a target whose compiler is missing is reported and skipped.
# Usage: tools/cross_compile.sh [python]   (default .venv/bin/python)
set -euo pipefail

PY=${1:-.venv/bin/python}
read -r CSRC INCLUDES <<<"$("$PY" -c 'from torch.utils.cpp_extension import include_paths as p
import sysconfig
from glowlm_kernels.build import CSRC
print(CSRC, " ".join("-I" + d for d in p() + [sysconfig.get_paths()["include"]]))')"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

status=0
for target in arm:neon:aarch64-linux-gnu-g++ arm:neon-bf16:aarch64-linux-gnu-g++ \
              s390x:z14:s390x-linux-gnu-g++ s390x:z15:s390x-linux-gnu-g++; do
  IFS=: read -r plugin isa cxx <<<"$target"
  if ! command -v "$cxx" >/dev/null; then
    echo "skip: $cxx not installed"
    continue
  fi
  read -r -a flags <<<"$("$PY" -c "from glowlm_kernels.build import VARIANTS
print(' '.join(VARIANTS['$plugin']['$isa'].cflags))")"
  for src in "$CSRC"/torch/*.cpp; do
    start=$SECONDS
    # -w: torch's own headers warn under -std=c++17; the kernels' code is what is checked.
    # shellcheck disable=SC2086
    if "$cxx" -std=c++17 "${flags[@]}" -w $INCLUDES -I"$CSRC" -c "$src" \
        -o "$OUT/$isa-$(basename "$src").o"; then
      echo "ok   $plugin $isa $(basename "$src") ($((SECONDS - start)) s)"
    else
      echo "FAIL $plugin $isa $(basename "$src")"
      status=1
    fi
  done
done
exit $status

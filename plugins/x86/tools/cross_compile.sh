#!/usr/bin/env bash
# Cross-compile the kernel sources on vec_portable.h for other CPU families.
#
# Why: the kernels are meant to be ported by writing one vector header. This checks,
# without the hardware, that every source compiles to object code for aarch64 (NEON)
# and s390x (z14 vector facility) against the portable header; running them is
# covered on x86 by test_portable_vector_header_passes_the_contract_suite.
#
# Needs the Debian cross compilers (apt-get install g++-12-aarch64-linux-gnu
# g++-12-s390x-linux-gnu); a target whose compiler is missing is reported and skipped.
# Usage: plugins/x86/tools/cross_compile.sh [python]   (default .venv/bin/python)
set -euo pipefail

PY=${1:-.venv/bin/python}
CSRC=$(cd "$(dirname "$0")/../glowlm_x86/kernels/csrc" && pwd)
INCLUDES=$("$PY" -c 'from torch.utils.cpp_extension import include_paths as p
import sysconfig; print(" ".join("-I" + d for d in p() + [sysconfig.get_paths()["include"]]))')
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

status=0
for target in "aarch64-linux-gnu-g++-12 -march=armv8.2-a+fp16" \
              "s390x-linux-gnu-g++-12 -march=z14"; do
  read -r cxx march <<<"$target"
  if ! command -v "$cxx" >/dev/null; then
    echo "skip: $cxx not installed"
    continue
  fi
  for src in "$CSRC"/*.cpp; do
    start=$SECONDS
    # -w: torch's own headers warn under -std=c++17; the kernels' code is what is checked.
    if "$cxx" -std=c++17 -O3 -fopenmp -DGLOWLM_VEC_PORTABLE $march -w $INCLUDES \
        -I"$CSRC" -c "$src" -o "$OUT/$(basename "$src").o"; then
      echo "ok   $cxx $(basename "$src") ($((SECONDS - start)) s)"
    else
      echo "FAIL $cxx $(basename "$src")"
      status=1
    fi
  done
done
exit $status

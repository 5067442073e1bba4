#!/bin/sh
# The Arm suite, run inside the emulated arm64 root by tools/arm64_root.py (make test-arm64),
# from /src, once per emulated CPU (GLOWLM_ARM64_CPU: neon or neon-bf16).
set -eu
echo "== glowlm platforms (the selection an aarch64 server makes)"
glowlm platforms
# Two processes: the plugin's own tests replay hosts whose kernel module cannot load,
# and a process remembers a module's first load result (glowlm_kernels.build.load).
echo "== the engine on the installed extension (tests/arm64)"
python -m pytest -q -rs -p no:cacheprovider tests/arm64 "$@"
echo "== the Arm plugin's tests: the kernel contract through the torch ops, linear choice"
exec python -m pytest -q -rs -p no:cacheprovider plugins/arm/tests "$@"

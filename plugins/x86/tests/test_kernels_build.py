"""Build machinery: cache keys, and the one-line fallback when no compiler is available."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_x86.kernels import build

FALLBACK_SCRIPT = """
import sys
from glowlm.plugin_api import live_host as live
from glowlm_x86.platform import X86Platform
cpu = live()
match = X86Platform.detect(cpu)
if not match.matched:
    print("SKIP"); sys.exit(0)
p = X86Platform(cpu, match)
ops = p.ops()
print("REFERENCE" if ops.replaced() == [] else "COMPILED", p.capabilities.kernels,
      p.attention_backend().name)
"""


def test_cache_key_separates_isas_and_names_the_module() -> None:
    assert build.source_hash("avx2") != build.source_hash("avx512")
    name = build.module_name("avx2")
    assert name.startswith("glowlm_x86_avx2_") and build.source_hash("avx2") in name


def test_every_source_is_compiled_and_hashed() -> None:
    from glowlm_kernels.build import tree_files

    cpp = {p.relative_to(build.CSRC).as_posix() for p in (build.CSRC / "torch").glob("*.cpp")}
    assert set(build.SOURCES) == cpp  # none left out of the module
    hashed = {p.relative_to(build.CSRC).as_posix() for p in tree_files()}
    assert set(build.SOURCES) <= hashed
    assert {"cpu/vec.h", "arch/vec_avx512.h", "arch/vec_neon.h", "torch/dispatch.h"} <= hashed


def test_the_torch_free_programs_compile_every_quantized_source() -> None:
    # One source per quantized tile family: the module links them (build.QUANT_SOURCES),
    # and the contract driver and bench_quant include the same files over test/aten_shim.
    from glowlm_kernels.build import QUANT_SOURCES

    quant = {p.relative_to(build.CSRC).as_posix()
             for p in (build.CSRC / "torch").glob("quant_*.cpp")}
    assert set(QUANT_SOURCES) == quant and set(QUANT_SOURCES) <= set(build.SOURCES)
    for program in ("contract_driver.cpp", "bench_quant.cpp"):
        text = (build.CSRC / "test" / program).read_text()
        assert set(re.findall(r'#include "(torch/quant_\w+\.cpp)"', text)) == quant, program


def _run_fallback(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "GLOWLM_KERNEL_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], env=full, text=True,
                          capture_output=True, timeout=300)


def test_no_compiler_is_one_warning_and_reference_kernels(tmp_path: Path) -> None:
    # A variant never built at install (portable), an empty cache and no compiler on
    # PATH: the run-time build cannot start.
    out = _run_fallback(tmp_path, PATH=str(tmp_path / "no-bin"), GLOWLM_KERNEL_ISA="portable")
    if out.stdout.strip() == "SKIP":
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "REFERENCE", out.stdout
    assert "() reference" in out.stdout
    warnings = [ln for ln in out.stderr.splitlines() if "kernels unavailable" in ln]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0], out.stderr


def test_kernels_built_at_install_load_without_a_compiler(tmp_path: Path) -> None:
    # pip install compiled avx2 and avx512 into the package: no compiler, no cache needed.
    from glowlm.plugin_api import live_host as live
    from glowlm_kernels.build import prebuilt
    from glowlm_x86.kernels import cpu_isa

    isa = cpu_isa(live())
    if isa is None or prebuilt(build.VARIANTS[isa], build.PACKAGE_DIR)[0] is None:
        pytest.skip("no kernel module built at install for this CPU's ISA (GLOWLM_BUILD_KERNELS=0 "
                    "or sources changed since the install)")
    out = _run_fallback(tmp_path, PATH=str(tmp_path / "no-bin"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "COMPILED", out.stdout + out.stderr
    assert "compiling" not in out.stderr and not (tmp_path / "cache").exists()


def test_disable_kernels_never_builds(tmp_path: Path) -> None:
    out = _run_fallback(tmp_path, GLOWLM_DISABLE_KERNELS="1")
    if out.stdout.strip() == "SKIP":
        return
    assert out.stdout.split()[0] == "REFERENCE", out.stdout
    assert "kernels unavailable" not in out.stderr
    assert not (tmp_path / "cache").exists()


HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)


def test_kernel_isa_follows_the_live_cpu_not_the_recorded_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.plugin_api import from_dump
    from glowlm_x86.platform import X86Platform

    skylake = from_dump(HOSTS / "x86_64-skylake-xeon-8124m.cpuinfo")
    zen3 = from_dump(HOSTS / "x86_64-zen3-epyc-milan-live.cpuinfo")
    platform = X86Platform(skylake, X86Platform.detect(skylake))
    assert platform.capabilities.isa == "avx512"
    monkeypatch.setattr("glowlm_x86.platform.live_host", lambda: zen3)
    assert platform.kernel_isa() == "avx2"  # never AVX-512 code on an AVX2-only CPU
    monkeypatch.setattr("glowlm_x86.platform.live_host", lambda: skylake)
    assert platform.kernel_isa() == "avx512"  # AVX-512 without AVX512_BF16
    zen4 = from_dump(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo")
    monkeypatch.setattr("glowlm_x86.platform.live_host", lambda: zen4)
    assert platform.kernel_isa() == "avx512-bf16"  # vdpbf16ps only where the CPU has it
    avx2_platform = X86Platform(zen3, X86Platform.detect(zen3))
    assert avx2_platform.kernel_isa() == "avx2"  # an AVX2 platform never picks AVX-512


def test_kernel_isa_request_is_honoured_only_where_the_cpu_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.plugin_api import ConfigError, from_dump
    from glowlm_x86.platform import X86Platform

    skylake = from_dump(HOSTS / "x86_64-skylake-xeon-8124m.cpuinfo")
    zen3 = from_dump(HOSTS / "x86_64-zen3-epyc-milan-live.cpuinfo")
    avx512_platform = X86Platform(skylake, X86Platform.detect(skylake))
    avx2_platform = X86Platform(zen3, X86Platform.detect(zen3))
    monkeypatch.setattr("glowlm_x86.platform.live_host", lambda: skylake)
    for isa in ("avx512", "avx2", "portable"):
        monkeypatch.setenv("GLOWLM_KERNEL_ISA", isa.upper())
        assert avx512_platform.kernel_isa() == isa
    with pytest.raises(ConfigError, match="lacks avx512_bf16"):
        monkeypatch.setenv("GLOWLM_KERNEL_ISA", "avx512-bf16")
        avx512_platform.kernel_isa()
    with pytest.raises(ConfigError, match="runs the AVX2 platform"):
        monkeypatch.setenv("GLOWLM_KERNEL_ISA", "avx512")
        avx2_platform.kernel_isa()
    monkeypatch.setattr("glowlm_x86.platform.live_host", lambda: zen3)
    with pytest.raises(ConfigError, match="lacks avx512f, avx512bw, avx512vl"):
        avx512_platform.kernel_isa()
    monkeypatch.setenv("GLOWLM_KERNEL_ISA", "sse4")
    with pytest.raises(ConfigError, match="built for avx2, avx512, avx512-bf16, portable"):
        avx2_platform.kernel_isa()


CONTRACT_SUITE = ("test_kernels.py", "test_kernels_linear.py", "test_kernels_attention.py",
                  "test_kernels_fused.py", "test_engine_parity.py")


def test_portable_vector_header_passes_the_contract_suite() -> None:
    # The kernels built on vec_portable.h (no intrinsics) pass the same tests as the
    # AVX2/AVX-512 builds: the proof that a port needs only a new vector header. A
    # separate process: one process registers one kernel module. ~2 min to build once.
    from glowlm.plugin_api import core_env

    if core_env().disable_kernels or build._compiler() is None:
        pytest.skip("compiled kernels disabled or no C++ compiler")
    here = Path(__file__).parent
    env = {**os.environ, "GLOWLM_KERNEL_ISA": "portable"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         *(str(here / t) for t in CONTRACT_SUITE)],
        env=env, text=True, capture_output=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout.splitlines()[-1], out.stdout


def _lower_isas() -> list[str]:
    """The install-built modules below the best one this CPU runs (each forced in turn)."""
    from glowlm.plugin_api import live_host
    from glowlm_x86.kernels import cpu_isa

    best = cpu_isa(live_host())
    order = ["avx512-bf16", "avx512", "avx2"]
    return order[order.index(best) + 1:] if best in order else []


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_lower_variants_pass_the_contract_suite_on_a_higher_cpu(isa: str) -> None:
    # The default run tests the best module this CPU executes; the lower ones that users
    # on older CPUs get (avx512 without AVX512_BF16: Skylake/Ice Lake; avx2) are forced
    # here with GLOWLM_KERNEL_ISA, so every variant the host can run is tested on it.
    from glowlm.plugin_api import core_env

    if core_env().disable_kernels:
        pytest.skip("compiled kernels disabled")
    if isa not in _lower_isas():
        pytest.skip(f"{isa} is not below this CPU's best module (the default run tests it, "
                    "or the CPU cannot run it)")
    here = Path(__file__).parent
    env = {**os.environ, "GLOWLM_KERNEL_ISA": isa}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         *(str(here / t) for t in (*CONTRACT_SUITE, "test_quant_kernels.py"))],
        env=env, text=True, capture_output=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout, out.stdout

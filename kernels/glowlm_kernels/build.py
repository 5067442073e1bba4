"""Which modules the one kernel tree compiles into, how, and how a process loads one.

Every CPU plugin builds the same sources (``csrc/torch/*.cpp`` over ``csrc/cpu``) once
per ISA variant, with that variant's flags; the variant's vector header is picked
by those flags (``csrc/cpu/vec.h``). The module registers the ops under the plugin's
namespace (``torch.ops.glowlm_x86``, ``glowlm_arm``, ``glowlm_s390x``).

Built at install: a plugin's ``setup.py`` calls :func:`setup_kwargs`, so ``pip install``
compiles every ISA variant it ships into the package (``_kernels_<isa>.*.so``) and
records each one's :func:`source_hash` in ``_kernels_build.json``. At run time
:func:`load` takes that prebuilt module when its hash still matches the tree it was
built from; the developer fallback compiles into ``GLOWLM_KERNEL_CACHE`` (one log line)
only when it does not: an editable checkout whose sources changed since the install,
another torch, or a variant not built at install (x86 ``portable``). Nothing here
touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CSRC = Path(__file__).parent / "csrc"
#: The quantized linear ops' translation units: one per tile family (weight-only with
#: fp32 / bf16 activations, weight-only with int8 activations, W8A8) over
#: ``torch/quant_common.h``, and their registration.
QUANT_SOURCES = tuple(f"torch/{name}" for name in (
    "quant_wna16.cpp", "quant_wna8.cpp", "quant_w8a8.cpp", "quant_registration.cpp"))
#: What those sources include of their own (hashed with them: :mod:`.quant`).
QUANT_HEADERS = ("torch/quant_common.h", "torch/quant_ops.h")
#: The torch module's translation units (the algorithms are headers under csrc/cpu).
TORCH_SOURCES = (*(f"torch/{name}" for name in (
    "registration.cpp", "norm_act.cpp", "rotary.cpp", "linear.cpp", "gemm.cpp",
    "gemm_packed.cpp", "attention.cpp", "fused_layer.cpp", "gemma_layer.cpp", "moe.cpp",
    "lora.cpp")),
    *QUANT_SOURCES, "torch/collective.cpp")
BUILD_INFO = "_kernels_build.json"
#: Rough run-time (fallback) build time on a busy 2-vCPU machine (shown to the user).
EXPECTED_BUILD_SECONDS = 240


@dataclass(frozen=True)
class Variant:
    """One compiled module: a plugin's kernels for one ISA, and the flags that select it."""

    plugin: str
    isa: str
    flags: tuple[str, ...]
    #: gcc 12 for aarch64 stops with an internal compiler error on one loop at -O3.
    opt: str = "-O3"

    @property
    def namespace(self) -> str:
        return f"glowlm_{self.plugin}"

    @property
    def cflags(self) -> tuple[str, ...]:
        return (self.opt, "-fopenmp", "-DNDEBUG", "-DGLOWLM_TORCH",
                f"-DGLOWLM_OPS_NAMESPACE={self.namespace}", *self.flags)

    @property
    def stem(self) -> str:
        """File stem of the module installed in the plugin's package."""
        return "_kernels_" + self.isa.replace("-", "_")


_X86_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c")
#: plugin -> ISA -> variant. A new CPU family is a vector header, a row here, detection.
VARIANTS: dict[str, dict[str, Variant]] = {
    "x86": {
        "avx2": Variant("x86", "avx2", ("-mavx2", "-mfma", "-mf16c")),
        "avx512": Variant("x86", "avx512", _X86_AVX512),
        # AVX-512 plus AVX512_BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): the
        # same kernels, and where activations are bf16 the pairwise bf16 dot product
        # (vdpbf16ps) replaces the convert-then-FMA inner loops (vec.h GLOWLM_VEC_BF16DOT).
        "avx512-bf16": Variant("x86", "avx512-bf16", (*_X86_AVX512, "-mavx512bf16")),
        # vec_portable.h on the baseline target: proves the kernels need only vec.h's
        # names; a developer path (GLOWLM_KERNEL_ISA=portable), not built at install.
        "portable": Variant("x86", "portable", ("-DGLOWLM_VEC_PORTABLE",)),
    },
    "arm": {
        "neon": Variant("arm", "neon", ("-march=armv8-a",), opt="-O2"),
        "neon-bf16": Variant("arm", "neon-bf16", ("-march=armv8.6-a+bf16",), opt="-O2"),
    },
    "s390x": {
        "z14": Variant("s390x", "z14", ("-march=z14",)),
        "z15": Variant("s390x", "z15", ("-march=z15",)),
    },
}
#: What each plugin compiles at install (x86 portable stays a run-time developer build).
INSTALL_ISAS = {"x86": ("avx2", "avx512", "avx512-bf16"), "arm": ("neon", "neon-bf16"),
                "s390x": ("z14", "z15")}
#: The build machines (``platform.machine()``) each plugin's kernels compile on; every
#: plugin installs everywhere, and elsewhere it installs without them.
BUILD_MACHINES = {"x86": ("x86_64", "amd64"), "arm": ("aarch64", "arm64"),
                  "s390x": ("s390x",)}


def tree_files() -> list[Path]:
    """Every header and source of the torch module (the qemu test driver excluded)."""
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp")
                  and p.relative_to(CSRC).parts[0] != "test")


def source_hash(variant: Variant, torch_version: str | None = None,
                python: tuple[int, int] | None = None) -> str:
    """Hash of the tree, the variant's flags, and the torch and Python versions.

    ``torch_version`` and ``python`` default to this process's; a cross build (``make
    test-arm64`` compiles the Arm modules on the x86 host for an emulated root) passes
    the target environment's, so the module it records loads there as prebuilt.
    """
    if torch_version is None:
        import torch

        torch_version = str(torch.__version__)
    major, minor = python or (sys.version_info.major, sys.version_info.minor)
    h = hashlib.sha256(" ".join(TORCH_SOURCES).encode())  # which files the module links
    for path in tree_files():
        h.update(path.relative_to(CSRC).as_posix().encode())
        h.update(path.read_bytes())
    h.update(" ".join(variant.cflags).encode())
    h.update(torch_version.encode())
    h.update(f"py{major}{minor}".encode())
    return h.hexdigest()[:16]


def module_name(variant: Variant) -> str:
    """Name of a run-time (fallback) build in the cache: plugin, ISA and source hash."""
    return f"glowlm_{variant.plugin}_{variant.isa.replace('-', '_')}_{source_hash(variant)}"


def compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx.split()[0]):
        return cxx
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def program_command(variant: Variant, source: Path, out: Path, cxx: str = "g++",
                    includes: Sequence[Path] = ()) -> list[str]:
    """The compile command of a torch-free program over the tree (``csrc/test``: the
    contract driver, the GEMV bandwidth bench): the variant's own flags and ``-O`` level
    without the torch ones, OpenMP for ``parallel.h``; ``includes`` go before ``csrc``."""
    return [cxx, "-std=c++17", "-fopenmp", variant.opt, "-DNDEBUG", *variant.flags,
            *(f"-I{p}" for p in includes), f"-I{CSRC}", str(source), "-o", str(out)]


# -- install time ---------------------------------------------------------------------


def setup_kwargs(plugin: str, package: str) -> dict[str, Any]:
    """``ext_modules`` and ``cmdclass`` for a plugin's ``setup()``: every ISA variant.

    ``GLOWLM_BUILD_KERNELS=0`` installs without compiled kernels (the plugin then runs
    core's reference ops and says so). Without torch in the build environment or
    without a compiler the install stops with one line saying what to do.
    """
    if os.environ.get("GLOWLM_BUILD_KERNELS", "1").strip().lower() in ("0", "false", "no"):
        return {}
    import platform

    if platform.machine().lower() not in BUILD_MACHINES[plugin]:
        return {}  # its CPU family is not this machine's: nothing of it could run here
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        raise SystemExit(f"glowlm-{plugin}: building its kernels needs torch in the build "
                         f"environment: pip install --no-build-isolation ./plugins/{plugin} "
                         "(or GLOWLM_BUILD_KERNELS=0 to install without them)") from None
    variants = [VARIANTS[plugin][isa] for isa in INSTALL_ISAS[plugin]]

    class Build(BuildExtension):  # type: ignore[misc, valid-type]
        """torch's BuildExtension, plus the compiler check and the build record."""

        def run(self) -> None:
            if compiler() is None:
                raise SystemExit(f"glowlm-{plugin}: no C++ compiler (c++, g++ or clang++) "
                                 "to build its kernels; install one (apt-get install g++) or "
                                 "set GLOWLM_BUILD_KERNELS=0 to install without them")
            # Hashed before compiling: a source edited during the build (an editable
            # checkout) then no longer matches the record, and the loader rebuilds at run
            # time instead of taking a module compiled from the older text.
            info = {v.isa: source_hash(v) for v in variants}
            start = time.perf_counter()
            super().run()
            # Beside the modules, and in the source package: an editable install
            # (setuptools' editable mode) copies only the modules back into it.
            build_py = self.get_finalized_command("build_py")
            dirs = {Path(self.get_ext_fullpath(ext.name)).parent for ext in self.extensions}
            dirs.add(Path(build_py.get_package_dir(package)))
            for d in dirs:
                if d.is_dir():
                    (d / BUILD_INFO).write_text(json.dumps(info, indent=1, sort_keys=True)
                                                + "\n")
            print(f"glowlm-{plugin}: built kernels {', '.join(info)} in "
                  f"{time.perf_counter() - start:.0f} s")

    exts = [CppExtension(f"{package}.{v.stem}", _stubs(v), include_dirs=[str(CSRC)],
                         extra_compile_args={"cxx": list(v.cflags)},
                         extra_link_args=["-fopenmp"]) for v in variants]
    return {"ext_modules": exts, "cmdclass": {"build_ext": Build}}


def _stubs(variant: Variant) -> list[str]:
    """One ``#include`` stub per source under ``build/kernel-src/<isa>/`` (relative paths).

    setuptools names object files after their sources, so every variant compiling the
    same files would share (and overwrite) one set of objects; a tree outside the
    plugin's directory would even put them outside ``build/``. The stubs give each
    variant its own sources, inside the plugin's build directory.
    """
    out = Path("build") / "kernel-src" / variant.isa
    out.mkdir(parents=True, exist_ok=True)
    stubs = []
    for src in TORCH_SOURCES:
        stub = out / Path(src).name
        text = f'#include "{src}"\n'
        if not stub.exists() or stub.read_text() != text:
            stub.write_text(text)
        stubs.append(stub.as_posix())
    return stubs


# -- run time -------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelLibrary:
    """A loaded kernel module: which ISA, its name, where its shared library lives, and
    whether it was built at install (``prebuilt``) or by the run-time fallback."""

    isa: str
    name: str
    path: Path
    prebuilt: bool = True


_lock = threading.Lock()
_loaded: dict[tuple[str, str], KernelLibrary | None] = {}


def prebuilt(variant: Variant, package_dir: Path) -> tuple[Path | None, str]:
    """The module ``pip install`` built for ``variant``, if it matches the tree; else why not."""
    files = sorted(package_dir.glob(f"{variant.stem}.*so")) + sorted(
        package_dir.glob(f"{variant.stem}.so"))
    if not files:
        return None, "not built at install"
    try:
        recorded = json.loads((package_dir / BUILD_INFO).read_text()).get(variant.isa)
    except (OSError, ValueError):
        recorded = None
    if recorded != source_hash(variant):
        return None, ("the kernel sources, flags or torch changed since the install "
                      "(editable checkout?)")
    return files[0], ""


def _build(variant: Variant, cache_dir: str, why: str, logger: Any) -> Path:
    from torch.utils import cpp_extension

    if compiler() is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    name = module_name(variant)
    build_dir = Path(cache_dir) / name
    so_path = build_dir / f"{name}.so"
    if so_path.exists():
        return so_path
    build_dir.mkdir(parents=True, exist_ok=True)
    logger.info("compiling glowlm-%s kernels (%s) at run time, once, ~%d s: %s "
                "(developer fallback; pip install builds them ahead of time)", variant.plugin,
                variant.isa, EXPECTED_BUILD_SECONDS, why)
    start = time.perf_counter()
    cpp_extension.load(
        name=name, sources=[str(CSRC / s) for s in TORCH_SOURCES],
        extra_cflags=list(variant.cflags), extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(CSRC)], build_directory=str(build_dir),
        is_python_module=False, verbose=False)
    logger.info("compiled glowlm-%s kernels (%s) in %.0f s into %s", variant.plugin,
                variant.isa, time.perf_counter() - start, build_dir)
    return so_path


def ops_registered(namespace: str) -> bool:
    import torch

    try:
        getattr(torch.ops, namespace).rms_norm.default  # noqa: B018 - raises if missing
    except (AttributeError, RuntimeError):
        return False
    return True


def load(variant: Variant, package_dir: Path, cache_dir: str, logger: Any
         ) -> KernelLibrary | None:
    """Load ``variant``'s module: the prebuilt one, else the run-time build; None on failure.

    Idempotent and thread-safe within a process (operators register only once, so the
    first result is remembered). Any failure is one warning line on ``logger``.
    """
    import torch

    key = (variant.plugin, variant.isa)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        library: KernelLibrary | None = None
        try:
            path, why = prebuilt(variant, package_dir)
            if path is None:
                path = _build(variant, cache_dir, why, logger)
            if not ops_registered(variant.namespace):
                torch.ops.load_library(str(path))
            library = KernelLibrary(variant.isa, path.name.split(".")[0], path,
                                    prebuilt=not why)
        except Exception as exc:  # a broken toolchain must not stop the engine
            reason = one_line(str(exc)) or type(exc).__name__
            logger.warning("glowlm-%s kernels unavailable (%s: %s); using core's reference "
                           "kernels", variant.plugin, type(exc).__name__, reason)
        _loaded[key] = library
        return library


def one_line(text: str) -> str:
    """The first compiler ``error:`` line of a build log, else the message, shortened."""
    errors = [ln.strip() for ln in text.splitlines() if "error:" in ln]
    return " ".join((errors[0] if errors else text).split())[:300]

"""An emulated arm64 Linux for the Arm plugin: built once, then its tests run in it.

``make test-arm64`` calls this. The Arm plugin's Python has otherwise only run on
recorded hosts and its kernels only through the torch-free driver (``make
test-cross``); here the plugin runs as on an aarch64 server, with PyPI's aarch64 torch
2.13.0 and the plugin's compiled torch extension, under qemu-user:

1. **root**: ``debootstrap --arch=arm64`` (Debian bookworm, minbase with python3) into
   ``.arm64/root``; the second stage runs under qemu through binfmt_misc (mounted and
   registered here from qemu-user-static's entry when missing).
2. **venv**: ``/opt/glowlm`` inside the root, from aarch64 wheels pip downloads on the
   host (``--platform``). torch goes in ``--no-deps``: PyPI's aarch64 torch 2.13.0
   declares CUDA packages it does not need on a CPU (and that are GBs).
3. **sources**: core, the kernel tree and the Arm plugin (with their tests) copied to
   ``/src`` and installed editable with ``GLOWLM_BUILD_KERNELS=0``.
4. **kernels**: the Arm modules (``neon``, ``neon-bf16``) cross-compiled on the host
   with Debian's ``aarch64-linux-gnu-g++`` (native compiler speed; g++ under qemu would
   take hours), with each variant's flags from ``glowlm_kernels.build.VARIANTS``, the
   root torch's headers, linked against its ``libc10``/``libtorch_cpu``. The build
   record holds the hash for the root's torch and Python, so the plugin loads them as
   prebuilt, exactly as after ``pip install`` on an Arm machine.
5. **run**: for each CPU (``neon``: qemu's ``neoverse-n1``, ARMv8.2 like the Graviton 2
   whose recorded ``/proc/cpuinfo`` it is shown; ``neon-bf16``: qemu's ``max`` with the
   recorded Graviton 3), a private mount namespace with ``/proc``, ``/sys``, ``/dev``,
   ``/dev/shm`` and that cpuinfo
   bound in (qemu 7.2 shows the host's own), then the given command under chroot.

Steps whose result is already there are skipped; a change to the kernel tree rebuilds
the modules, a change to the sources is copied again. Needs root, debootstrap,
qemu-user-static and g++-aarch64-linux-gnu (installed with apt-get when missing).

Usage: ``tools/arm64_root.py [--root DIR] [--cpu neon,neon-bf16] [--] COMMAND...``
(default command: the Arm suite, ``tests/arm64/run_suite.sh``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "kernels"))

from glowlm_kernels import build  # noqa: E402

DIST = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VENV = "/opt/glowlm"
PYTHON = (3, 11)
TORCH = "2.13.0"
CXX = "aarch64-linux-gnu-g++"
APT = {"debootstrap": "debootstrap", "qemu-aarch64-static": "qemu-user-static",
       CXX: "g++-aarch64-linux-gnu"}
#: What the suite imports besides torch (pip resolves their dependencies on the host).
WHEELS = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec",
          "transformers>=4.45", "tokenizers", "safetensors", "gguf>=0.10",
          "huggingface_hub>=2.4", "pluggy>=1.3", "numpy", "tqdm", "fastapi", "uvicorn",
          "pydantic>=2", "llguidance>=1.0", "prometheus-client>=0.20", "archspec",
          "pytest", "openai", "httpx", "setuptools", "wheel")
#: PyPI's aarch64 torch 2.13.0 is its CUDA build: libtorch_cpu itself links libcudart and
#: libcupti, so it imports only beside the CUDA runtime wheels (it never touches a GPU).
#: Its pins, except NCCL: the pinned 2.29.7 has no aarch64 wheel on PyPI; 2.32.3 has the
#: same soname (libnccl.so.2). Installed --no-deps (2.2 GB), since pip cannot resolve the
#: pin. PyPI has no CPU-only aarch64 build of this torch.
CUDA_WHEELS = ("cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,"
               "nvjitlink,nvrtc,nvtx]==13.0.3", "cuda-bindings>=13.0.3,<14",
               "nvidia-cudnn-cu13==9.20.0.48", "nvidia-cusparselt-cu13==0.8.1",
               "nvidia-nccl-cu13==2.32.3", "nvidia-nvshmem-cu13==3.4.5")
PLATFORM_TAGS = (*(f"manylinux_2_{n}_aarch64" for n in range(17, 40)),
                 "manylinux2014_aarch64", "linux_aarch64")
HOSTS = REPO / "core/glowlm/testing/hosts"
#: CPU name -> (qemu -cpu model, recorded /proc/cpuinfo it is shown).
CPUS = {"neon": ("neoverse-n1", HOSTS / "aarch64-graviton2-neoverse-n1.cpuinfo"),
        "neon-bf16": ("max", HOSTS / "aarch64-graviton3-neoverse-v1.cpuinfo")}
COPIED = ("core", "kernels", "plugins/arm", "tests/arm64", "conftest.py", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info",
                                 "_kernels_build.json", ".pytest_cache")


def step(msg: str) -> None:
    print(f"[arm64 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload]


def ensure_tools() -> None:
    missing = [pkg for tool, pkg in APT.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(f"arm64: missing {', '.join(missing)} (apt-get install them as root)")
    step(f"installing {' '.join(missing)}")
    run(["apt-get", "install", "-y", "-qq", *missing],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)


def ensure_binfmt() -> None:
    """qemu-aarch64 registered with the F flag (the interpreter opened now, so it also
    runs inside the chroot, which has no qemu of its own)."""
    misc = Path("/proc/sys/fs/binfmt_misc")
    if not (misc / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(misc)])
    if (misc / "qemu-aarch64").exists():
        return
    entry = next(line for line in Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
                 .read_text().splitlines() if line.startswith(":"))
    (misc / "register").write_text(entry)
    step("registered qemu-aarch64 in binfmt_misc")


def ensure_root(root: Path) -> None:
    if (root / ".glowlm-root-done").exists():
        return
    if not (root / "debootstrap").exists() and not (root / "usr/bin/python3").exists():
        step(f"debootstrap arm64 {DIST} into {root} (first stage, downloads ~60 MB)")
        run(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase",
             "--include=python3,python3-venv,python3-dev,libatomic1", DIST, str(root), MIRROR],
            stdout=subprocess.DEVNULL)
    if (root / "debootstrap").exists():
        step("debootstrap second stage under qemu (about 10 min)")
        run(["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"],
            stdout=subprocess.DEVNULL)
    (root / ".glowlm-root-done").touch()


def ensure_libatomic(root: Path) -> None:
    """The shared-memory collectives take their aarch64 fences from libatomic (a root
    made before it was in the debootstrap list lacks it)."""
    if any((root / "usr/lib/aarch64-linux-gnu").glob("libatomic.so.1*")):
        return
    step("apt-get install libatomic1 in the root (under qemu)")
    chroot(root, ["sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                  "apt-get install -y -qq libatomic1 >/dev/null"])


def download_wheels(wheels: Path) -> None:
    """aarch64 wheels for the venv, resolved and fetched by the host's pip."""
    if (wheels / ".done").exists():
        return
    wheels.mkdir(parents=True, exist_ok=True)
    tags = [a for t in PLATFORM_TAGS for a in ("--platform", t)]
    common = ["download", "--quiet", "--only-binary=:all:", "--implementation", "cp",
              "--python-version", f"{PYTHON[0]}.{PYTHON[1]}", *tags, "-d", str(wheels)]
    step("pip download: aarch64 torch (427 MB), its CUDA runtime (2.2 GB) and the "
         "suite's dependencies")
    run([sys.executable, "-m", "pip", *common, "--no-deps", f"torch=={TORCH}"])
    cuda = [*common[:-1], str(wheels / "cuda")]
    run([sys.executable, "-m", "pip", *cuda, *CUDA_WHEELS])
    run([sys.executable, "-m", "pip", *common, *WHEELS])
    (wheels / ".done").touch()


def chroot(root: Path, cmd: list[str], cpu: str = "neon-bf16", check: bool = True,
           env: dict[str, str] | None = None) -> int:
    """``cmd`` in the root, in a private mount namespace (mounts vanish with it)."""
    qemu_cpu, cpuinfo = CPUS[cpu]
    mounts = (f"mount -t proc proc {root}/proc && mount --bind {cpuinfo} {root}/proc/cpuinfo"
              f" && mount --rbind /dev {root}/dev && mount -t tmpfs shm {root}/dev/shm"
              f" && mount -t sysfs sys {root}/sys")
    inner = {"PATH": f"{VENV}/bin:/usr/bin:/bin", "HOME": "/root", "QEMU_CPU": qemu_cpu,
             "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
             "HF_HUB_OFFLINE": "1", **(env or {})}
    exports = " ".join(f"{k}={v!s}" for k, v in inner.items())
    script = f"{mounts} && exec env -i {exports} {shutil.which('chroot')} {root} \"$@\""
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script, "sh", *cmd])
    if check and proc.returncode != 0:
        sys.exit(f"arm64: {' '.join(cmd)} exited with {proc.returncode}")
    return proc.returncode


def ensure_venv(root: Path, wheels: Path) -> None:
    if (root / VENV.lstrip("/") / ".done").exists():
        return
    inside = root / "wheels"
    if inside.exists():
        shutil.rmtree(inside)
    shutil.copytree(wheels, inside)
    step(f"venv {VENV} in the root: torch {TORCH} (aarch64) and the suite's dependencies "
         "(pip under qemu, several minutes)")
    chroot(root, ["python3", "-m", "venv", VENV])
    pip = [f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--find-links", "/wheels"]
    chroot(root, [*pip, "--no-deps", f"torch=={TORCH}"])
    chroot(root, ["sh", "-c", f"{' '.join(pip)} --no-deps /wheels/cuda/*.whl"])
    # --upgrade: the venv's own setuptools (Debian's 66) predates PEP 639 licenses.
    chroot(root, [*pip, "--upgrade", *WHEELS])
    shutil.rmtree(inside)
    (root / VENV.lstrip("/") / ".done").touch()


def site_packages(root: Path) -> Path:
    return root / VENV.lstrip("/") / f"lib/python{PYTHON[0]}.{PYTHON[1]}/site-packages"


def sync_sources(root: Path) -> bool:
    """Copy the sources the suite needs to ``/src``; True when they changed."""
    src = root / "src"
    stamp = src / ".glowlm-sources"
    h = hashlib.sha256()
    for rel in COPIED:
        top = REPO / rel
        files = [top] if top.is_file() else sorted(
            p for p in top.rglob("*") if p.is_file() and not any(
                part in ("__pycache__", "build", ".pytest_cache") or part.endswith(
                    ".egg-info") for part in p.relative_to(REPO).parts)
            and p.suffix != ".so" and p.name != build.BUILD_INFO)
        for f in files:
            h.update(f.relative_to(REPO).as_posix().encode())
            h.update(f.read_bytes())
    digest = h.hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return False
    step("copying core, the kernel tree and the Arm plugin to /src")
    keep = {}
    arm_pkg = src / "plugins/arm/glowlm_arm"
    for f in [*arm_pkg.glob("_kernels_*.so"), arm_pkg / build.BUILD_INFO]:
        if f.exists():
            keep[f.name] = f.read_bytes()
    for rel in COPIED:
        dst = src / rel
        if (REPO / rel).is_file():
            shutil.copy2(REPO / rel, dst)
            continue
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(REPO / rel, dst, ignore=IGNORED)
    for name, data in keep.items():
        (arm_pkg / name).write_bytes(data)
    if not (site_packages(root) / "__editable__.glowlm_arm-0.1.0.pth").exists() and \
            not any(site_packages(root).glob("__editable__*glowlm_arm*")):
        step("pip install -e (no kernels: they are cross-compiled) under qemu")
        chroot(root, [f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-deps",
                      "--no-build-isolation", "-e", "/src/kernels", "-e", "/src/core",
                      "-e", "/src/plugins/arm"], env={"GLOWLM_BUILD_KERNELS": "0"})
    stamp.write_text(digest)
    return True


def cross_build(root: Path, jobs: int) -> None:
    """The Arm modules, compiled on the host for the root's torch (see the module doc)."""
    torch_dir = site_packages(root) / "torch"
    pkg = root / "src/plugins/arm/glowlm_arm"
    record_path = pkg / build.BUILD_INFO
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    suffix = f".cpython-{PYTHON[0]}{PYTHON[1]}-aarch64-linux-gnu.so"
    # The root torch's own __version__ (PyPI's aarch64 build says "2.13.0+cu130"): the
    # loader there hashes with it.
    version_py = (torch_dir / "version.py").read_text()
    torch_version = version_py.split("__version__ = ", 1)[1].split("\n", 1)[0].strip("'\"")
    wanted = {isa: build.source_hash(v, torch_version=torch_version, python=PYTHON)
              for isa, v in build.VARIANTS["arm"].items()
              if isa in build.INSTALL_ISAS["arm"]}
    todo = [isa for isa, h in wanted.items()
            if record.get(isa) != h or not (pkg / f"{build.VARIANTS['arm'][isa].stem}{suffix}")
            .exists()]
    if not todo:
        return
    includes = ["-I", str(build.CSRC), "-I", str(torch_dir / "include"),
                "-I", str(torch_dir / "include/torch/csrc/api/include")]
    objdir = root / "tmp/glowlm-cross"
    objdir.mkdir(parents=True, exist_ok=True)
    jobs_list = []
    for isa in todo:
        v = build.VARIANTS["arm"][isa]
        for src in build.TORCH_SOURCES:
            obj = objdir / f"{isa}-{Path(src).stem}.o"
            jobs_list.append((isa, obj, [CXX, "-std=c++20", "-fPIC", "-w", *v.cflags,
                                         *includes, "-c", str(build.CSRC / src),
                                         "-o", str(obj)]))
    step(f"cross-compiling the Arm kernels ({', '.join(todo)}): {len(jobs_list)} "
         f"translation units with {CXX}, {jobs} at a time")
    start = time.monotonic()
    done = 0

    def compile_one(job: tuple[str, Path, list[str]]) -> None:
        subprocess.run(job[2], check=True)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for fut in concurrent.futures.as_completed(
                [pool.submit(compile_one, j) for j in jobs_list]):
            fut.result()
            done += 1
            step(f"  {done}/{len(jobs_list)} compiled ({time.monotonic() - start:.0f} s)")
    for isa in todo:
        v = build.VARIANTS["arm"][isa]
        objs = [str(objdir / f"{isa}-{Path(src).stem}.o") for src in build.TORCH_SOURCES]
        out = pkg / f"{v.stem}{suffix}"
        run([CXX, "-shared", "-fopenmp", *objs, "-o", str(out),
             "-L", str(torch_dir / "lib"), "-lc10", "-ltorch_cpu",
             "-Wl,-rpath,$ORIGIN", "-Wl,--allow-shlib-undefined"])
        record[isa] = wanted[isa]
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    step(f"Arm kernels built in {time.monotonic() - start:.0f} s: "
         + ", ".join(f"{pkg.relative_to(root)}/{build.VARIANTS['arm'][i].stem}{suffix}"
                     for i in todo))


def prepare(root: Path) -> None:
    ensure_tools()
    ensure_binfmt()
    ensure_root(root)
    ensure_libatomic(root)
    download_wheels(root.parent / "wheels")
    ensure_venv(root, root.parent / "wheels")
    sync_sources(root)
    cross_build(root, jobs=os.cpu_count() or 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO / ".arm64/root")
    ap.add_argument("--cpu", default="neon,neon-bf16",
                    help="comma list of: " + ", ".join(CPUS))
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("command", nargs="*", help="run in the root from /src "
                    "(default: sh tests/arm64/run_suite.sh)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("arm64: needs root (debootstrap, binfmt_misc, chroot and mounts)")
    root = args.root.resolve()
    root.parent.mkdir(parents=True, exist_ok=True)
    prepare(root)
    if args.prepare_only:
        return 0
    status = 0
    for cpu in args.cpu.split(","):
        if cpu not in CPUS:
            sys.exit(f"arm64: unknown --cpu {cpu!r} (known: {', '.join(CPUS)})")
        command = args.command or ["sh", "/src/tests/arm64/run_suite.sh"]
        step(f"{cpu}: qemu -cpu {CPUS[cpu][0]}, /proc/cpuinfo from {CPUS[cpu][1].name}: "
             f"{' '.join(command)}")
        start = time.monotonic()
        rc = chroot(root, ["sh", "-c", 'cd /src && exec "$@"', "sh", *command], cpu=cpu,
                    check=False, env={"GLOWLM_ARM64_CPU": cpu})
        step(f"{cpu}: exit {rc} after {time.monotonic() - start:.0f} s")
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())

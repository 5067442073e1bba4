"""Build and run glowlm's image with the real Docker engine (tests/docker, docs/docker.md).

What the tests need, found or made on this machine, or a one-line reason to skip:

- a Docker CLI that builds with BuildKit (``docker buildx``, or a CLI before 23.0
  with ``DOCKER_BUILDKIT=1``) and a daemon: one already running, or ``dockerd``
  started here as root (and stopped at the end);
- the base image: ``BASE_IMAGE`` (default ``python:3.11-slim-bookworm``) when it is
  present or can be pulled; else, with no registry reachable, a Debian bookworm root
  file system made by ``debootstrap --variant=minbase`` and ``docker import``-ed as
  ``glowlm-base:bookworm`` (~1 min, once);
- torch's CPU build: a ``torch-2.13.0+cpu`` wheel from pip's ``find-links`` is put into
  ``docker/wheels/`` and installed from there; without one, PyTorch's CPU index (the
  Dockerfile's default);
- pip's CA bundle (``PIP_CERT`` or pip's ``cert`` setting) as the ``pip_cert`` build
  secret, for a TLS-intercepting proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
WHEELS = REPO / "docker" / "wheels"
IMAGE = os.environ.get("GLOWLM_TEST_IMAGE", "glowlm:cpu")
ZEN_IMAGE = os.environ.get("GLOWLM_TEST_ZEN_IMAGE", "glowlm:zen")
OFFICIAL_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "glowlm-base:bookworm"
TORCH_WHEEL = re.compile(r"torch-2\.13\.0\+cpu-cp(\d+)-cp\d+-(?:manylinux|linux)\S*_x86_64\.whl")
#: Figures the session prints at its end (build times, start-up times).
FIGURES: dict[str, str] = {}


class Unavailable(Exception):
    """Docker cannot be used here; the message is the one-line reason."""


def _run(cmd: list[str], timeout: float = 120, check: bool = True, **kw: object
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def _clis() -> list[str]:
    """Every ``docker`` executable on PATH, in PATH order (a newer CLI may lack buildx)."""
    seen: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = Path(d) / "docker"
        if p.is_file() and os.access(p, os.X_OK) and str(p.resolve()) not in map(
                lambda s: str(Path(s).resolve()), seen):
            seen.append(str(p))
    return seen


def _builds_with_buildkit(cli: str) -> bool:
    if _run([cli, "buildx", "version"], check=False, timeout=30).returncode == 0:
        return True
    out = _run([cli, "version", "--format", "{{.Client.Version}}"], check=False, timeout=30)
    m = re.match(r"(\d+)\.", out.stdout.strip())
    return bool(m) and int(m.group(1)) < 23  # built-in BuildKit under DOCKER_BUILDKIT=1


@dataclass
class Docker:
    """The CLI the tests call, and the daemon process if the tests started it."""

    cli: str
    daemon: subprocess.Popen[bytes] | None = None
    daemon_log: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_BUILDKIT": "1"}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
        return _run([self.cli, *args], timeout=timeout, check=check, env=self.env)

    def has_image(self, ref: str) -> bool:
        return self("image", "inspect", ref, check=False).returncode == 0

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
            self.daemon = None


def connect(workdir: Path) -> Docker:
    """A Docker CLI with BuildKit and a running daemon, starting ``dockerd`` if needed."""
    clis = [c for c in _clis() if _builds_with_buildkit(c)]
    if not clis:
        raise Unavailable("no docker CLI that builds with BuildKit on PATH "
                          "(install docker.io, or docker-ce with docker-buildx)")
    docker = Docker(clis[0])
    if docker("info", check=False, timeout=60).returncode == 0:
        return docker
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise Unavailable("no Docker daemon running, and dockerd cannot be started here "
                          "(needs root and dockerd)")
    # The daemon picks its storage driver (overlay2 where the kernel has it, else vfs).
    docker.daemon_log = workdir / "dockerd.log"
    with open(docker.daemon_log, "wb") as log:
        docker.daemon = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if docker("info", check=False, timeout=30).returncode == 0:
            return docker
        if docker.daemon.poll() is not None:
            break
        time.sleep(1)
    tail = docker.daemon_log.read_text(errors="replace").strip().splitlines()[-1:]
    docker.stop_daemon()
    raise Unavailable(f"dockerd did not start: {tail[0] if tail else 'no output'}")


def base_image(docker: Docker) -> str:
    """``BASE_IMAGE`` when present or pullable, else the debootstrap-made local base."""
    wanted = os.environ.get("BASE_IMAGE", OFFICIAL_BASE)
    if docker.has_image(wanted):
        return wanted
    if docker("pull", wanted, check=False, timeout=600).returncode == 0:
        return wanted
    if docker.has_image(LOCAL_BASE):
        return LOCAL_BASE
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise Unavailable(f"{wanted} cannot be pulled and no local base can be made "
                          "(debootstrap needs root and the debootstrap package)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="glowlm-rootfs-") as root:
        _run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv",
              "bookworm", root, "http://deb.debian.org/debian"], timeout=1200)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (Path(root) / cache).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([docker.cli, "import", "-", LOCAL_BASE], stdin=tar.stdout,
                                  capture_output=True, text=True, timeout=600)
        tar.wait()
        if imported.returncode != 0:
            raise RuntimeError(f"docker import failed: {imported.stderr.strip()}")
    FIGURES["local base image (debootstrap + docker import)"] = \
        f"{time.monotonic() - start:.0f} s"
    return LOCAL_BASE


def _pip_setting(name: str) -> list[str]:
    """Values of one of pip's settings (env ``PIP_<NAME>`` and ``pip config``)."""
    values = os.environ.get(f"PIP_{name.upper().replace('-', '_')}", "").split()
    out = _run([sys.executable, "-m", "pip", "config", "list"], check=False, timeout=60)
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.split(".")[-1] == name:
            values += value.strip().strip("'\"").split()
    return values


def torch_source(docker: Docker, base: str) -> str:
    """``TORCH_SOURCE`` for the build: a local wheel for the base's Python, else the index."""
    py = docker("run", "--rm", "--entrypoint", "python3", base, "-c",
                "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')").stdout.strip()
    for d in _pip_setting("find-links"):
        d = d.removeprefix("file://")
        if not Path(d).is_dir():
            continue
        for wheel in sorted(Path(d).iterdir()):
            m = TORCH_WHEEL.fullmatch(wheel.name)
            if m and m.group(1) == py:
                dest = WHEELS / wheel.name
                if not dest.exists() or dest.stat().st_size != wheel.stat().st_size:
                    for old in WHEELS.glob("torch-*.whl"):
                        old.unlink()
                    try:
                        os.link(wheel, dest)
                    except OSError:
                        shutil.copyfile(wheel, dest)
                return "--find-links /wheels"
    return "--index-url https://download.pytorch.org/whl/cpu"


def pip_cert() -> str | None:
    for value in _pip_setting("cert"):
        if Path(value).is_file():
            return value
    return None


def build(docker: Docker, target: str, tag: str, log: Path) -> float:
    """``docker build`` the ``target`` of docker/Dockerfile as ``tag``; seconds taken."""
    base = base_image(docker)
    cmd = ["build", "-f", str(DOCKERFILE), "--target", target, "-t", tag, "--progress=plain",
           "--build-arg", f"BASE_IMAGE={base}",
           "--build-arg", f"TORCH_SOURCE={torch_source(docker, base)}"]
    cert = pip_cert()
    if cert:
        cmd += ["--secret", f"id=pip_cert,src={cert}"]
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run([docker.cli, *cmd, str(REPO)], stdout=out,
                              stderr=subprocess.STDOUT, env=docker.env, timeout=3600)
    took = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"docker build exited {proc.returncode} ({log}):\n{tail}")
    return took


# -- containers -------------------------------------------------------------------------


@dataclass
class Container:
    docker: Docker
    name: str
    url: str = ""

    def logs(self) -> str:
        out = self.docker("logs", self.name, check=False, timeout=60)
        return out.stdout + out.stderr

    def state(self) -> dict[str, object]:
        out = self.docker("inspect", "--format", "{{json .State}}", self.name, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def remove(self) -> None:
        self.docker("rm", "-f", self.name, check=False, timeout=120)


def run_server(docker: Docker, name: str, run_args: list[str], serve_args: list[str],
               timeout: float = 900, image: str | None = None) -> Container:
    """``docker run -d`` the image's (default: the cpu one's) ``glowlm serve`` on a
    published port; wait for /health."""
    docker("rm", "-f", name, check=False)
    docker("run", "-d", "--name", name, "-p", "127.0.0.1::8000", *run_args, image or IMAGE,
           "serve", "--host", "0.0.0.0", *serve_args)
    c = Container(docker, name)
    port = docker("port", name, "8000/tcp").stdout.split()[0].rsplit(":", 1)[1]
    c.url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not c.state().get("Running"):
            raise RuntimeError(f"container {name} exited during start-up:\n{c.logs()[-4000:]}")
        try:
            with urllib.request.urlopen(c.url + "/health", timeout=5) as r:
                if r.status == 200:
                    FIGURES[f"{name}: start-up to /health 200"] = \
                        f"{time.monotonic() - start:.0f} s"
                    return c
        except OSError:
            pass
        time.sleep(1)
    logs = c.logs()
    c.remove()
    raise RuntimeError(f"container {name}: no /health 200 within {timeout:.0f} s:\n"
                       f"{logs[-4000:]}")


def two_node_view(dest: Path) -> Path:
    """A copy of ``/sys/devices/system/node`` that shows this one-node host as two nodes.

    Why: glowlm binds memory only on a machine with several NUMA nodes (with one there
    is nothing to gain), so on a one-node host the container never makes the NUMA
    system calls whose permission the tests check. Mounted read-only over the node
    directory in the container, this view puts the first half of the CPUs on node 0
    and the rest on node 1; glowlm then binds its rank to node 0, which exists, and
    the real ``set_mempolicy`` meets the container's real seccomp profile and
    capabilities. Both nodes show node 0's meminfo.
    """
    src = Path("/sys/devices/system/node")
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    groups = [cpus[:half], cpus[half:] or cpus[:half]]
    meminfo = (src / "node0" / "meminfo").read_text()
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (dest / f).write_text("0-1\n")
    for i, group in enumerate(groups):
        d = dest / f"node{i}"
        d.mkdir(exist_ok=True)
        (d / "cpulist").write_text(",".join(map(str, group)) + "\n")
        (d / "meminfo").write_text(meminfo.replace("Node 0 ", f"Node {i} "))
        (d / "distance").write_text("10 20\n" if i == 0 else "20 10\n")
    return dest


def numa_nodes() -> int:
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1

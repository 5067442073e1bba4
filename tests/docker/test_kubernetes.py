"""deploy/kubernetes.yaml: valid against the Kubernetes schema, and saying what the docs say.

Runs in `make test` (no cluster, no Docker): the schema is the one the
``kubernetes-validate`` package ships (strict: unknown fields are errors); the memory
request is checked against glowlm's own memory plan for the manifest's model, args and
environment, computed here as the server computes it before loading.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import torch
import yaml
from glowlm.config import EngineConfig
from glowlm.default_model import default_model_path
from glowlm.engine.memory import GIB, plan_memory
from glowlm.entrypoints.cli.engine_args import engine_kwargs
from glowlm.entrypoints.cli.main import build_parser
from glowlm.model_loader.loader import read_model_dir
from glowlm.runtime import topology

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes.yaml"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def container() -> dict[str, Any]:
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def quantity_bytes(q: str) -> int:
    for suffix, factor in UNITS.items():
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * factor)
    return int(q)


@pytest.mark.parametrize("doc", documents(), ids=lambda d: d["kind"])
def test_manifest_is_valid_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    version = kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{doc['kind']} is not valid Kubernetes {version}: {exc.message} at "
                    f"{'.'.join(map(str, exc.path))}")


def test_schema_check_rejects_a_broken_manifest() -> None:
    """The check above can fail: a misspelt field and a wrong type are both caught."""
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    c = broken["spec"]["template"]["spec"]["containers"][0]
    c["securityContext"]["seccompProfle"] = c["securityContext"].pop("seccompProfile")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
    c = yaml.safe_load(yaml.safe_dump(deployment))
    c["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(c, kubernetes_validate.latest_version(), strict=True)


def test_security_context_allows_numa_binding_as_a_non_root_user() -> None:
    ctx = container()["securityContext"]
    assert ctx["capabilities"]["add"] == ["SYS_NICE"]
    assert ctx["seccompProfile"] == {"type": "Unconfined"}
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001  # the image's user


def test_probes_ask_health_on_the_served_port() -> None:
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    service = next(d for d in documents() if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def serve_config(c: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> EngineConfig:
    """The EngineConfig ``glowlm serve`` builds from the manifest's args and env."""
    for e in c["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    args = build_parser().parse_args(c["args"])
    assert args.model is None, "the manifest serves the image's default model"
    return EngineConfig.create(default_model_path(), online=True, **engine_kwargs(args))


def test_memory_request_is_the_memory_plan_rounded_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Request = limit (Guaranteed QoS): the plan plus what the process already holds when
    it plans, which the plan subtracts from the cgroup limit (torch and the tokenizer:
    0.48 GiB in the container, "2.99 GiB of 3.52 GiB (cgroup memory limit (4.0 GiB))"),
    rounded up by less than a GiB."""
    c = container()
    res = c["resources"]
    assert res["requests"] == res["limits"]
    request = quantity_bytes(res["requests"]["memory"])
    cfg = serve_config(c, monkeypatch)
    info = read_model_dir(cfg.model, None, None)
    plenty = f"MemAvailable: {64 * GIB // 1024} kB\n"
    plan = plan_memory(info, torch.bfloat16, cfg, cfg.max_model_len or 0,
                       topo=topology.read(), meminfo=plenty)
    assert plan.kv_cache_bytes == 2 * GIB
    held = GIB // 2
    assert plan.needed_bytes + held <= request < plan.needed_bytes + held + GIB, (
        f"{res['requests']['memory']} for {plan.describe()}")

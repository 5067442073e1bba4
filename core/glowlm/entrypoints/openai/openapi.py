"""The served ``/openapi.json``: every request body, status and content type the server uses.

Request bodies are parsed by the endpoints themselves (so every bad body is an
OpenAI-shaped 400 naming the field), which leaves FastAPI nothing to infer: its
generated schema would list no request body, a 422 that is never sent, and JSON
for ``/health`` and ``/metrics``. This module writes the schema from the same
pydantic models the endpoints parse with, plus the statuses they really answer
(400/401/404/408/413/503), so generated clients and schema-driven fuzzing
(``tests/reliability``) see the API as it is. A route it does not know keeps
FastAPI's description, minus the 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from glowlm.entrypoints.openai.http_guard import OPEN_PATHS
from glowlm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
)
from glowlm.entrypoints.openai.protocol.pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from glowlm.entrypoints.openai.responses import ChatCompletionResponse, CompletionResponse

_REF = "#/components/schemas/{model}"

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}}}

_MODEL_CARD = {
    "type": "object", "required": ["id", "object", "created", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                   "created": {"type": "integer"}, "owned_by": {"type": "string"},
                   "root": {"type": ["string", "null"]}, "parent": {"type": ["string", "null"]},
                   "max_model_len": {"type": "integer"}, "vocab_size": {"type": "integer"}}}

_HAND_WRITTEN: dict[str, dict[str, Any]] = {
    "ErrorResponse": _ERROR,
    "ModelCard": _MODEL_CARD,
    "ModelList": {"type": "object", "required": ["object", "data"],
                  "properties": {"object": {"const": "list"},
                                 "data": {"type": "array",
                                          "items": {"$ref": "#/components/schemas/ModelCard"}}}},
    "TokenizeResponse": {
        "type": "object", "required": ["count", "max_model_len", "tokens", "token_strs"],
        "properties": {"count": {"type": "integer"}, "max_model_len": {"type": "integer"},
                       "tokens": {"type": "array", "items": {"type": "integer"}},
                       "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}},
    "DetokenizeResponse": {"type": "object", "required": ["prompt"],
                           "properties": {"prompt": {"type": "string"}}},
    "VersionResponse": {"type": "object", "required": ["version"],
                        "properties": {"version": {"type": "string"}}},
}

_WHY = {400: "invalid request (the message and `param` name the field)",
        401: "missing or wrong API key",
        404: "unknown model or route, or a route this server has turned off",
        408: "the request body did not arrive in time", 413: "the request body is too large",
        503: "the server is at capacity (`Retry-After`) or shutting down"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _errors(*statuses: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in statuses:
        out[str(status)] = {"description": _WHY[status],
                            "content": {"application/json": {"schema": _ref("ErrorResponse")}}}
    if 503 in statuses:
        out["503"]["headers"] = {"Retry-After": {"schema": {"type": "string"},
                                                 "description": "seconds (queue full)"}}
    return out


def _json(name: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(name)}}}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


_BODY_ERRORS = (400, 404, 408, 413)

#: (path, method) -> the operation's requestBody (or None) and responses.
_OPERATIONS: dict[tuple[str, str], tuple[dict[str, Any] | None, dict[str, Any]]] = {
    ("/v1/models", "get"): (None, {"200": _json("ModelList")}),
    ("/v1/models/{model_id}", "get"): (None, {"200": _json("ModelCard"), **_errors(404)}),
    ("/v1/completions", "post"): (_body("CompletionRequest"), {
        "200": {"description": "the completion, or server-sent events when `stream` is true",
                "content": {"application/json": {"schema": _ref("CompletionResponse")},
                            "text/event-stream": {"schema": {"type": "string"}}}},
        **_errors(*_BODY_ERRORS, 503)}),
    ("/v1/chat/completions", "post"): (_body("ChatCompletionRequest"), {
        "200": {"description": "the chat completion, or server-sent events when `stream` "
                               "is true",
                "content": {"application/json": {"schema": _ref("ChatCompletionResponse")},
                            "text/event-stream": {"schema": {"type": "string"}}}},
        **_errors(*_BODY_ERRORS, 503)}),
    ("/health", "get"): (None, {"200": {"description": "the engine loop runs (empty body)"},
                                **_errors(503)}),
    ("/ping", "get"): (None, {"200": {"description": "the engine loop runs (empty body)"},
                              **_errors(503)}),
    ("/version", "get"): (None, {"200": _json("VersionResponse")}),
    ("/metrics", "get"): (None, {"200": {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}}}}),
    ("/tokenize", "post"): (_body("TokenizeRequest"), {"200": _json("TokenizeResponse"),
                                                       **_errors(*_BODY_ERRORS)}),
    ("/detokenize", "post"): (_body("DetokenizeRequest"), {"200": _json("DetokenizeResponse"),
                                                           **_errors(*_BODY_ERRORS)}),
}

#: The runtime LoRA routes (docs/lora.md): vLLM's text answer on success; 404 when
#: GLOWLM_ALLOW_RUNTIME_LORA_UPDATING is off, 400 for an adapter that cannot load, a
#: name taken, or (unload) a name not loaded.
for _path, _model, _done in (("/v1/load_lora_adapter", "LoadLoRAAdapterRequest", "loaded"),
                             ("/v1/unload_lora_adapter", "UnloadLoRAAdapterRequest",
                              "unloaded")):
    _OPERATIONS[(_path, "post")] = (_body(_model), {
        "200": {"description": f"the adapter was {_done} (a one-line message)",
                "content": {"text/plain": {"schema": {"type": "string"}}}},
        **_errors(*_BODY_ERRORS)})

#: The pooling routes (docs/pooling.md): a 400 on a server that generates text.
_POOLING = {"/v1/embeddings": "EmbeddingRequest", "/pooling": "PoolingRequest",
            "/classify": "ClassificationRequest", "/score": "ScoreRequest",
            "/v1/score": "ScoreRequest", "/rerank": "RerankRequest",
            "/v1/rerank": "RerankRequest", "/v2/rerank": "RerankRequest"}
for _path, _model in _POOLING.items():
    _OPERATIONS[(_path, "post")] = (_body(_model), {
        "200": {"description": "the pooled outputs (docs/pooling.md)",
                "content": {"application/json": {"schema": {"type": "object"}}}},
        **_errors(*_BODY_ERRORS, 503)})

_MODELS: tuple[tuple[type[BaseModel], str], ...] = (
    (EmbeddingRequest, "validation"), (PoolingRequest, "validation"),
    (ClassificationRequest, "validation"), (ScoreRequest, "validation"),
    (RerankRequest, "validation"),
    (CompletionRequest, "validation"), (ChatCompletionRequest, "validation"),
    (TokenizeRequest, "validation"), (DetokenizeRequest, "validation"),
    (LoadLoRAAdapterRequest, "validation"), (UnloadLoRAAdapterRequest, "validation"),
    (CompletionResponse, "serialization"), (ChatCompletionResponse, "serialization"))


def _component_schemas() -> dict[str, Any]:
    out: dict[str, Any] = dict(_HAND_WRITTEN)
    for model, mode in _MODELS:
        schema = model.model_json_schema(ref_template=_REF, mode=mode)  # type: ignore[arg-type]
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def build_openapi(app: FastAPI, secured: bool) -> dict[str, Any]:
    """The schema for ``app``; ``secured``: the API needs a key (401 and bearer auth
    on every path but the open ones)."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="OpenAI-compatible API served by glowlm "
                                     "(docs/server.md)")
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.update(_component_schemas())
    if secured:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            known = _OPERATIONS.get((path, method))
            if known is not None:
                body, responses = known
                op["responses"] = {k: dict(v) for k, v in responses.items()}
                if body is not None:
                    op["requestBody"] = body
            op.get("responses", {}).pop("422", None)
            if secured and path not in OPEN_PATHS:
                op["security"] = [{"bearer": []}]
                op["responses"].update(_errors(401))
    return schema


def install_openapi(app: FastAPI, secured: bool) -> None:
    """Serve :func:`build_openapi` (built once, on first request) as ``/openapi.json``."""
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cache:
            cache.update(build_openapi(app, secured))
        return cache

    app.openapi = openapi  # type: ignore[method-assign]

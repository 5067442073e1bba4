"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

:class:`APIError` carries the HTTP status and, where one field is to blame, its
name; a pydantic validation failure becomes one readable 400 naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    """An error returned to the client in OpenAI's shape, with its HTTP status."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


_TYPE_BY_STATUS = {401: "authentication_error", 404: "invalid_request_error",
                   500: "server_error", 503: "service_unavailable"}


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_to_api_error(exc: ValidationError) -> APIError:
    """The first pydantic error as one readable 400 naming the field."""
    err = exc.errors(include_url=False)[0]
    where = _loc(tuple(err["loc"]))
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "json_invalid":
        return APIError(f"the request body is not valid JSON: {msg}", code="invalid_json")
    if err["type"] == "extra_forbidden":
        return APIError(f"unrecognized request argument: {where}", param=where,
                        code="unknown_field")
    if not where:
        return APIError(f"the request body must be a JSON object: {msg}", code="invalid_body")
    return APIError(f"{where}: {msg}", param=str(err["loc"][0]), code="invalid_value")


_FIELD = re.compile(r"^([a-z_]+)")


def param_of(message: str, known: set[str]) -> str | None:
    """The field a SamplingParams/engine message starts with, if it is a request field."""
    m = _FIELD.match(message)
    return m.group(1) if m and m.group(1) in known else None

"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}, for every failure.

Routes raise APIError; the handlers installed here turn it, unknown routes, wrong methods
and anything unexpected into that body, so a client never sees an HTML page or a bare 500.
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("specwise.server")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
               503: "service_unavailable_error"}

TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


RETRY_AFTER_S = 1       # a 429's Retry-After: requests finish within seconds; retrying sooner only adds load


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 details: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.details = details or {}        # more fields of the error object (a 429's bounds)

    def body(self) -> dict:
        error_type = ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code,
                          **self.details}}

    def response(self) -> JSONResponse:
        headers = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": str(RETRY_AFTER_S)}}.get(self.status)
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_validation_error(error: ValidationError) -> APIError:
    """The first problem pydantic found, named by its field path (`messages.0.role`).

    Of the errors a union field collects (one per member type), the deepest is the one
    that matched the input's shape best: `stop: [""]` reports the empty string, not "not a string".
    """
    errors = error.errors(include_url=False)
    first = max((e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]), key=lambda e: len(e["loc"]))
    param = field_path(first["loc"])
    if first["type"] == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first['msg']}", code="invalid_json")
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unknown or unsupported parameter {param!r}", param, "unsupported_parameter")
    message = f"{param}: {first['msg']}" if param else first["msg"]
    return APIError(400, message, param, "invalid_value")


def field_path(loc) -> str | None:
    """("stop", "list[constrained-str]", 0) -> "stop.0": union member tags are not field names."""
    parts = [str(part) for part in loc
             if not (isinstance(part, str) and (part in TYPE_TAGS or not part.isidentifier()))]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(ValidationError, _validation_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(request: Request, error: APIError) -> JSONResponse:
    return error.response()


async def _validation_error(request: Request, error) -> JSONResponse:
    if isinstance(error, ValidationError):
        return from_validation_error(error).response()
    first = error.errors()[0]
    param = field_path(first["loc"])
    return APIError(400, f"{param}: {first['msg']}", param, "invalid_value").response()


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    message = {404: f"no route {request.url.path}",
               405: f"method {request.method} is not allowed on {request.url.path}"}.get(error.status_code,
                                                                                       str(error.detail))
    return APIError(error.status_code, message).response()


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return APIError(500, f"internal error: {type(error).__name__}", code="internal_error").response()

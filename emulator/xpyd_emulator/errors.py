"""OpenAI-style errors as vLLM renders them: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import orjson

# vLLM's ErrorInfo.type for each status (code is the HTTP status as an int, as vLLM sends it).
ERROR_TYPES = {
    400: "BadRequestError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    503: "ServiceUnavailableError",
}


def error_body(message: str, status: int, param: str | None = None) -> bytes:
    kind = ERROR_TYPES.get(status, "InternalServerError")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


class ApiError(Exception):
    """An OpenAI-style error: rendered as {"error": {message, type, param, code}} with `status`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "InternalServerError")

    def body(self) -> bytes:
        return error_body(self.message, self.status, self.param)


class CommandLineError(ValueError):
    """A command line or env the emulator cannot run with; the message names the problem and the fix."""

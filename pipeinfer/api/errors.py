"""The error objects of the OpenAI-style API: an ApiError carries its HTTP status and the
`{"error": {"message", "type", "code"}}` object (`code`: the status, as llama-server gives
it; `param`: the request field at fault, when one is)."""

from __future__ import annotations

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               404: "not_found_error", 405: "invalid_request_error",
               413: "invalid_request_error",
               500: "server_error", 503: "unavailable_error"}


class ApiError(Exception):
    """A request the server answers with an error object (`status`: the HTTP status)."""

    def __init__(self, status: int, message: str, kind: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers or {}   # e.g. Retry-After on a 503
        self.kind = kind or ERROR_TYPES.get(status, "server_error")

    def body(self) -> dict:
        error = {"message": self.message, "type": self.kind, "code": self.status}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}

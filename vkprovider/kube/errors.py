"""Error classes for apiserver answers, sorted by what a caller can do about them.

A caller above `vkprovider.kube` never sees aiohttp exceptions: a request either returns a raw
dict or raises one of these.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An apiserver answered with an error status (or could not be reached, see Unreachable)."""

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


class Unreachable(ApiError):
    """No HTTP answer at all: connection refused, reset, TLS failure or timeout."""

    #: The apiserver that did not answer (a caller talking to several tells them apart).
    server: str = ""


class NoCredentials(ApiError):
    """Not sent: the kubeconfig's credential could not be obtained (an exec plugin missing or
    failing, an unreadable token file); the message names who uses it and why."""


class Fenced(ApiError):
    """Not sent: this process's writes are fenced off (it lost its leadership)."""


class Unauthorized(ApiError):
    """401: the credentials were not accepted."""


class Forbidden(ApiError):
    """403: authenticated but not allowed (RBAC, admission)."""


class NotFound(ApiError):
    """404: the object or the resource type does not exist."""


class Conflict(ApiError):
    """409: a resourceVersion or UID precondition did not hold."""


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists: a create found the name taken."""


class Gone(ApiError):
    """410: a watch or list continued from a resourceVersion that has been compacted."""


class Invalid(ApiError):
    """422: the object failed validation; retrying the same request cannot succeed."""


class TooManyRequests(ApiError):
    """429: throttled (priority and fairness); retry after `retry_after` seconds."""

    def __init__(
        self, status: int, reason: str, message: str, body: dict[str, Any] | None = None, retry_after: float = 1.0
    ) -> None:
        super().__init__(status, reason, message, body)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx: the apiserver (or something behind it) failed; usually worth a retry."""


def error_for(status: int, body: dict[str, Any] | None, text: str, retry_after: str | None = None) -> ApiError:
    """Map an HTTP status and a decoded Status body to the matching error class."""
    reason = str((body or {}).get("reason") or "")
    message = str((body or {}).get("message") or text[:500])
    if status == 401:
        return Unauthorized(status, reason or "Unauthorized", message, body)
    if status == 403:
        return Forbidden(status, reason or "Forbidden", message, body)
    if status == 404:
        return NotFound(status, reason or "NotFound", message, body)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(status, reason, message, body)
        return Conflict(status, reason or "Conflict", message, body)
    if status == 410:
        return Gone(status, reason or "Expired", message, body)
    if status == 422:
        return Invalid(status, reason or "Invalid", message, body)
    if status == 429:
        try:
            delay = float(retry_after) if retry_after else 1.0
        except ValueError:
            delay = 1.0
        return TooManyRequests(status, reason or "TooManyRequests", message, body, retry_after=delay)
    if status >= 500:
        return ServerError(status, reason or "InternalError", message, body)
    return ApiError(status, reason or "Error", message, body)

"""Exceptions raised by the client, and the ones handlers raise to steer retries."""

from __future__ import annotations

from typing import Any, Optional


class OverseerError(Exception):
    """Base class of every error this SDK raises."""


class TransportError(OverseerError):
    """No answer from the server (refused connection, timeout, reset)."""


class ApiError(OverseerError):
    """The server answered with an error: the fields of its `application/problem+json`."""

    def __init__(
        self,
        status: int,
        type: str = "about:blank",
        title: str = "",
        detail: str = "",
        field: Optional[str] = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.field = field
        where = f" (field {field})" if field else ""
        super().__init__(f"{status} {title}: {detail}{where}")

    @classmethod
    def from_body(cls, status: int, body: Any) -> "ApiError":
        """Builds the subclass matching `status` from a decoded problem body (or anything)."""
        if not isinstance(body, dict):
            body = {"detail": str(body) if body is not None else ""}
        kind = {404: NotFoundError, 409: ConflictError}.get(status, ApiError)
        field = body.get("field")
        return kind(
            status=int(body.get("status", status)),
            type=str(body.get("type", "about:blank")),
            title=str(body.get("title", "")),
            detail=str(body.get("detail", "")),
            field=str(field) if field is not None else None,
        )


class NotFoundError(ApiError):
    """404: no such job, lease, schedule or route."""


class ConflictError(ApiError):
    """409: the request conflicts with the current state (a finished job, a lost lease,
    an idempotency key reused with another body)."""


class RetryableError(Exception):
    """Raised by a handler: this attempt failed, but another may succeed."""


class FatalError(Exception):
    """Raised by a handler: no attempt can succeed; the step fails for good
    (`retryable: false`), which starts compensation or blocks the job as it declares."""

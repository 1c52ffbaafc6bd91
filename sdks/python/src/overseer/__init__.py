"""Python SDK for Overseer: a client for the HTTP API and a worker that runs step handlers."""

from .client import AsyncClient, Client
from .context import Context
from .errors import (
    ApiError,
    ConflictError,
    FatalError,
    NotFoundError,
    OverseerError,
    RetryableError,
    TransportError,
)
from .worker import Worker

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConflictError",
    "Context",
    "FatalError",
    "NotFoundError",
    "OverseerError",
    "RetryableError",
    "TransportError",
    "Worker",
]
__version__ = "0.1.0"

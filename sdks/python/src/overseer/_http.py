"""What the sync and async clients share: server selection, requests, answers, errors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import ApiError, TransportError

DEFAULT_SERVER = "http://127.0.0.1:7433"
Servers = Union[str, Sequence[str], None]
Params = List[Tuple[str, Any]]


def resolve_servers(server: Servers) -> List[str]:
    """The server URLs to use: the argument, else `OVERSEER_SERVER` (comma-separated
    for several), else the default."""
    if server is None:
        server = os.environ.get("OVERSEER_SERVER") or DEFAULT_SERVER
    urls = server.split(",") if isinstance(server, str) else list(server)
    urls = [u.strip().rstrip("/") for u in urls if u.strip()]
    if not urls:
        raise ValueError("at least one server URL is needed")
    return urls


def resolve_token(token: Optional[str]) -> Optional[str]:
    return token if token is not None else (os.environ.get("OVERSEER_TOKEN") or None)


def headers(token: Optional[str]) -> Dict[str, str]:
    h = {"accept": "application/json", "user-agent": "overseer-python/0.1"}
    if token:
        h["authorization"] = f"Bearer {token}"
    return h


def seg(value: str) -> str:
    """One path segment, escaped (names may hold `/` or spaces)."""
    return quote(str(value), safe="")


def span(seconds: float) -> str:
    """A duration in the server's notation, in whole milliseconds."""
    return f"{max(0, int(round(seconds * 1000)))}ms"


@dataclass
class Call:
    """One HTTP request, described independently of sync or async sending."""

    method: str
    path: str
    params: Params = field(default_factory=list)
    body: Any = None
    has_body: bool = False
    headers: Dict[str, str] = field(default_factory=dict)


def post(path: str, body: Any = None) -> Call:
    return Call("POST", path, body=body, has_body=body is not None)


def operator_body(by: Optional[str], reason: Optional[str]) -> Dict[str, str]:
    body: Dict[str, str] = {}
    if by is not None:
        body["by"] = by
    if reason is not None:
        body["reason"] = reason
    return body


def list_params(
    state: Optional[str],
    label: Union[None, str, Mapping[str, str]],
    limit: Optional[int],
    cursor: Optional[str],
) -> Params:
    params: Params = []
    if state is not None:
        params.append(("state", state))
    if isinstance(label, str):
        params.append(("label", label))
    elif label is not None:
        params.extend(("label", f"{k}:{v}") for k, v in label.items())
    if limit is not None:
        params.append(("limit", str(limit)))
    if cursor is not None:
        params.append(("cursor", cursor))
    return params


def decode(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer (None when empty); an `ApiError` subclass otherwise."""
    if response.is_success:
        if response.status_code == 204 or not response.content:
            return None
        return response.json()
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise ApiError.from_body(response.status_code, body)


class Failover:
    """Which server to talk to. A connection that could not even be opened moves on to
    the next URL; nothing was sent, so repeating the request there is safe."""

    def __init__(self, servers: Servers) -> None:
        self.urls = resolve_servers(servers)
        self.index = 0

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def url(self, path: str) -> str:
        return self.current + path

    def next(self) -> None:
        self.index = (self.index + 1) % len(self.urls)


def transport_error(e: httpx.TransportError, url: str) -> TransportError:
    return TransportError(f"{url}: {type(e).__name__}: {e}")


TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

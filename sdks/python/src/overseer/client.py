"""HTTP clients for the Overseer API: `Client` (blocking) and `AsyncClient` (asyncio).

Both expose the same methods; every request is described once in `_Api` and sent by the
subclass's `_send`. Answers are the server's JSON (dicts and lists), unchanged."""

from __future__ import annotations

import asyncio
import time
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

import httpx

from . import _http as h
from ._http import Call
from .wire import CompleteRequest, FailRequest, HeartbeatRequest, LeaseRequest, RerunRequest

JSON = Dict[str, Any]
Label = Union[None, str, Mapping[str, str]]
R = TypeVar("R")
Pick = Optional[Callable[[Any], Any]]


def _jobs(x: Any) -> Any:
    return x["jobs"]


class _Api(Generic[R]):
    """Every API call, once. `R` is what a call returns: the answer, or an awaitable of it."""

    def _send(self, call: Call, pick: Pick = None) -> R:
        raise NotImplementedError

    # Jobs
    def submit(self, spec: Mapping[str, Any]) -> R:
        """Submits one job spec; answers the job (an idempotent repeat answers the existing one)."""
        return self._send(h.post("/v1/jobs", dict(spec)))

    def submit_batch(self, specs: Sequence[Mapping[str, Any]]) -> R:
        """Submits several jobs, all or nothing; answers the jobs in order."""
        return self._send(h.post("/v1/jobs:batch", {"jobs": [dict(s) for s in specs]}), _jobs)

    def submit_batch_minimal(self, specs: Sequence[Mapping[str, Any]]) -> R:
        """`submit_batch` with `Prefer: return=minimal`: answers `{"id", "state", "created"}` per
        job, in order, instead of whole jobs (far less to send and decode for large batches)."""
        call = h.post("/v1/jobs:batch", {"jobs": [dict(s) for s in specs]})
        call.headers["prefer"] = "return=minimal"
        return self._send(call, _jobs)

    def get(self, job_id: str) -> R:
        return self._send(Call("GET", f"/v1/jobs/{h.seg(job_id)}"))

    def list(
        self,
        state: Optional[str] = None,
        label: Label = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> R:
        """One page, newest first: `{"jobs": [...], "next_cursor": str | None}`. `label` is
        `"key:value"` or a mapping (every pair must match)."""
        params = h.list_params(state, label, limit, cursor)
        return self._send(Call("GET", "/v1/jobs", params))

    def events(self, job_id: str) -> R:
        """The job's history, oldest first."""
        return self._send(Call("GET", f"/v1/jobs/{h.seg(job_id)}/events"), lambda x: x["events"])

    def cancel(self, job_id: str) -> R:
        return self._send(h.post(f"/v1/jobs/{h.seg(job_id)}/cancel"))

    def _wait_once(self, job_id: str, seconds: float) -> R:
        call = Call("GET", f"/v1/jobs/{h.seg(job_id)}/wait", [("timeout", h.span(seconds))])
        return self._send(call)

    # Operator actions on a blocked job
    def retry_step(
        self, job_id: str, step: str, by: Optional[str] = None, reason: Optional[str] = None
    ) -> R:
        path = f"/v1/jobs/{h.seg(job_id)}/steps/{h.seg(step)}/retry"
        return self._send(h.post(path, h.operator_body(by, reason)))

    def skip_step(
        self, job_id: str, step: str, by: Optional[str] = None, reason: Optional[str] = None
    ) -> R:
        path = f"/v1/jobs/{h.seg(job_id)}/steps/{h.seg(step)}/skip"
        return self._send(h.post(path, h.operator_body(by, reason)))

    def resume(self, job_id: str, by: Optional[str] = None, reason: Optional[str] = None) -> R:
        path = f"/v1/jobs/{h.seg(job_id)}/resume"
        return self._send(h.post(path, h.operator_body(by, reason)))

    # A failed or cancelled job, run again
    def rerun(
        self,
        job_id: str,
        from_failed: bool = False,
        by: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> R:
        """Runs a failed or cancelled job again as a new job; answers the new job (its
        `rerun_of` names this one). With `from_failed`, the steps that succeeded keep their
        results and are not run again. A job is rerun once: a second call is refused (409)."""
        body: RerunRequest = {"from_failed": from_failed}
        body.update(h.operator_body(by, reason))  # type: ignore[typeddict-item]
        return self._send(h.post(f"/v1/jobs/{h.seg(job_id)}/rerun", dict(body)))

    # Agents
    def agents(self) -> R:
        return self._send(Call("GET", "/v1/agents"), lambda x: x["agents"])

    def get_limits(self, agent: str) -> R:
        return self._send(Call("GET", f"/v1/agents/{h.seg(agent)}/limits"))

    def set_limits(
        self, agent: str, max_concurrency: Optional[int] = None, rate: Optional[float] = None
    ) -> R:
        """Replaces the agent's limits; `None` means unlimited."""
        body = {"max_concurrency": max_concurrency, "rate": rate}
        return self._send(Call("PUT", f"/v1/agents/{h.seg(agent)}/limits", [], body, True))

    def pause_agent(self, agent: str) -> R:
        return self._send(h.post(f"/v1/agents/{h.seg(agent)}/pause"))

    def resume_agent(self, agent: str) -> R:
        return self._send(h.post(f"/v1/agents/{h.seg(agent)}/resume"))

    # Schedules
    def create_schedule(self, spec: Mapping[str, Any]) -> R:
        return self._send(h.post("/v1/schedules", dict(spec)))

    def list_schedules(self) -> R:
        return self._send(Call("GET", "/v1/schedules"), lambda x: x["schedules"])

    def get_schedule(self, name: str) -> R:
        return self._send(Call("GET", f"/v1/schedules/{h.seg(name)}"))

    def update_schedule(self, name: str, spec: Mapping[str, Any]) -> R:
        """Replaces the schedule's cron, timezone, job, overlap and misfire in one step (`spec`
        as for `create_schedule`; its `name` defaults to `name`). The next due time counts
        from now under the new pattern; a paused schedule stays paused."""
        body = {"name": name, **dict(spec)}
        return self._send(Call("PUT", f"/v1/schedules/{h.seg(name)}", [], body, True))

    def delete_schedule(self, name: str) -> R:
        return self._send(Call("DELETE", f"/v1/schedules/{h.seg(name)}"))

    def pause_schedule(self, name: str) -> R:
        return self._send(h.post(f"/v1/schedules/{h.seg(name)}/pause"))

    def resume_schedule(self, name: str) -> R:
        return self._send(h.post(f"/v1/schedules/{h.seg(name)}/resume"))

    # The worker's calls
    def take_leases(self, agent: str, worker: str, max: int, wait: float) -> R:
        body: LeaseRequest = {"worker": worker, "max": max, "wait": h.span(wait)}
        return self._send(h.post(f"/v1/agents/{h.seg(agent)}/leases", body), lambda x: x["leases"])

    def heartbeat(self, lease_id: str, progress: Any = None) -> R:
        body: HeartbeatRequest = {} if progress is None else {"progress": progress}
        return self._send(h.post(f"/v1/leases/{h.seg(lease_id)}/heartbeat", body))

    def complete(self, lease_id: str, result: Any = None) -> R:
        body: CompleteRequest = {"result": result}
        return self._send(h.post(f"/v1/leases/{h.seg(lease_id)}/complete", body))

    def fail(self, lease_id: str, error: str, retryable: bool = True) -> R:
        body: FailRequest = {"error": error, "retryable": retryable}
        return self._send(h.post(f"/v1/leases/{h.seg(lease_id)}/fail", body))

    def report_batch(self, reports: Sequence[Mapping[str, Any]]) -> R:
        """Several lease outcomes in one call; answers one result per report, in order."""
        body = {"reports": [dict(r) for r in reports]}
        return self._send(h.post("/v1/leases:report", body), lambda x: x["results"])


class Client(_Api[Any]):
    """Blocking client. `server` is a URL or several (tried in turn when one cannot be
    reached); defaults come from `OVERSEER_SERVER` and `OVERSEER_TOKEN`."""

    def __init__(
        self,
        server: h.Servers = None,
        token: Optional[str] = None,
        timeout: float = 90.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._servers = h.Failover(server)
        self._http = httpx.Client(
            headers=h.headers(h.resolve_token(token)), timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call, pick: Pick = None) -> Any:
        for attempt in range(len(self._servers.urls)):
            url = self._servers.url(call.path)
            try:
                response = self._http.request(
                    call.method,
                    url,
                    params=call.params,
                    json=call.body if call.has_body else None,
                    headers=call.headers or None,
                )
            except httpx.ConnectError as e:
                self._servers.next()
                if attempt + 1 == len(self._servers.urls):
                    raise h.transport_error(e, url) from e
                continue
            except httpx.TransportError as e:
                raise h.transport_error(e, url) from e
            answer = h.decode(response)
            return pick(answer) if pick else answer
        raise AssertionError("unreachable")

    def wait(self, job_id: str, timeout: Optional[float] = None, poll: float = 30.0) -> JSON:
        """Long-polls until the job is terminal or `timeout` seconds passed (None: forever);
        answers the job as last seen, so check its `state`."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll if end is None else min(poll, max(0.0, end - time.monotonic()))
            job: JSON = self._wait_once(job_id, left)
            if job["state"] in h.TERMINAL or (end is not None and time.monotonic() >= end):
                return job

    def iter_jobs(
        self, state: Optional[str] = None, label: Label = None, page_size: int = 100
    ) -> Iterator[JSON]:
        """Every job matching the filters, newest first, fetching page after page."""
        cursor: Optional[str] = None
        while True:
            page = self.list(state, label, page_size, cursor)
            yield from page["jobs"]
            cursor = page.get("next_cursor")
            if not cursor:
                return


class AsyncClient(_Api[Awaitable[Any]]):
    """The asyncio twin of `Client`: the same methods, awaited."""

    def __init__(
        self,
        server: h.Servers = None,
        token: Optional[str] = None,
        timeout: float = 90.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._servers = h.Failover(server)
        self._http = httpx.AsyncClient(
            headers=h.headers(h.resolve_token(token)), timeout=timeout, transport=transport
        )

    @property
    def servers(self) -> List[str]:
        return list(self._servers.urls)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def rotate(self) -> None:
        """Moves to the next server URL (the worker does this when one stops answering)."""
        self._servers.next()

    def _send(self, call: Call, pick: Pick = None) -> Awaitable[Any]:
        return self._send_async(call, pick)

    async def _send_async(self, call: Call, pick: Pick) -> Any:
        for attempt in range(len(self._servers.urls)):
            url = self._servers.url(call.path)
            try:
                response = await self._http.request(
                    call.method,
                    url,
                    params=call.params,
                    json=call.body if call.has_body else None,
                    headers=call.headers or None,
                )
            except httpx.ConnectError as e:
                self._servers.next()
                if attempt + 1 == len(self._servers.urls):
                    raise h.transport_error(e, url) from e
                continue
            except httpx.TransportError as e:
                raise h.transport_error(e, url) from e
            answer = h.decode(response)
            return pick(answer) if pick else answer
        raise AssertionError("unreachable")

    async def wait(self, job_id: str, timeout: Optional[float] = None, poll: float = 30.0) -> JSON:
        """Long-polls until the job is terminal or `timeout` seconds passed (None: forever);
        answers the job as last seen, so check its `state`."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            left = poll if end is None else min(poll, max(0.0, end - loop.time()))
            job: JSON = await self._wait_once(job_id, left)
            if job["state"] in h.TERMINAL or (end is not None and loop.time() >= end):
                return job

    async def iter_jobs(
        self, state: Optional[str] = None, label: Label = None, page_size: int = 100
    ) -> AsyncIterator[JSON]:
        """Every job matching the filters, newest first, fetching page after page."""
        cursor: Optional[str] = None
        while True:
            page = await self.list(state, label, page_size, cursor)
            for job in page["jobs"]:
                yield job
            cursor = page.get("next_cursor")
            if not cursor:
                return

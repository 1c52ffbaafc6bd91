"""One attempt: the handler, its heartbeats, its local deadline and its report."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from .client import AsyncClient
from .context import Context, monotonic_of
from .errors import ConflictError, FatalError
from .reports import Report, Reporter

log = logging.getLogger("overseer.worker")

HEARTBEAT_MIN = 0.05
CANCELLED = Report("fail", error="cancelled", retryable=False)


def local_deadline(sent_at: float, lease_ms: int) -> float:
    """When a lease granted or renewed by a request sent at `sent_at` is given up: a margin
    (1/20 of it, at least 50 ms) before the server's own expiry."""
    margin = max(lease_ms // 20, 50)
    return sent_at + max(0, lease_ms - margin) / 1000.0


def next_beat(now: float, deadline: float, interval: float) -> float:
    """One interval from now, but no later than half-way to the deadline, so a lease that
    arrived late or was renewed for less than a timeout is still renewed in time."""
    return now + max(HEARTBEAT_MIN, min(interval, (deadline - now) / 2))


class Attempt:
    """One lease's attempt. `before_report`, when given, is awaited once nothing of the
    attempt runs any more (its handler ended or was dropped, or it never started) and just
    before its report is sent; it is not called when nothing is reported. The worker uses it
    to give the attempt's slot back while the report waits for its answer."""

    def __init__(
        self,
        client: AsyncClient,
        reporter: Reporter,
        pool: concurrent.futures.Executor,
        handler: Callable[[Context], Any],
        lease: Dict[str, Any],
        sent_at: float,
        before_report: Optional[Callable[[], Awaitable[None]]] = None,
    ) -> None:
        self.client = client
        self.reporter = reporter
        self.before_report = before_report
        self.pool = pool
        self.handler = handler
        self.lease = lease
        self.loop = asyncio.get_running_loop()
        self.deadline = local_deadline(sent_at, int(lease["lease_ms"]))
        base = int(lease.get("timeout_ms") or 0) or int(lease["lease_ms"])
        self.interval = max(HEARTBEAT_MIN, base / 3000.0)
        self.ctx = Context(lease, monotonic_of(self.loop, self.deadline))
        self.beat_now = asyncio.Event()
        self.progress: Any = None

    async def run(self) -> None:
        if not await self._confirm_if_late():
            return
        self.ctx._beat = self._request_beat
        self.ctx._set_progress = self._keep_progress
        work = self._start()
        try:
            report = await self._supervise(work)
        finally:
            self.ctx._cancel()
            if not work.done():
                work.cancel()
        if report is not None and self.loop.time() < self.deadline:
            await self._report(report)

    async def _report(self, report: Report) -> None:
        """Sends the report, after `before_report`. The reporter checks the deadline again,
        which may pass while `before_report` waits."""
        if self.before_report is not None:
            await self.before_report()
        await self.reporter.send(self.lease["lease_id"], report, self.deadline)

    def _request_beat(self, progress: Any) -> None:
        def ask() -> None:
            self.progress = progress
            self.beat_now.set()

        self.loop.call_soon_threadsafe(ask)

    def _keep_progress(self, progress: Any) -> None:
        def keep() -> None:
            self.progress = progress

        self.loop.call_soon_threadsafe(keep)

    def _start(self) -> "asyncio.Future[Any]":
        if inspect.iscoroutinefunction(self.handler):
            return self.loop.create_task(self.handler(self.ctx))
        return asyncio.wrap_future(self.pool.submit(self._call_sync))

    def _call_sync(self) -> Any:
        result = self.handler(self.ctx)
        if inspect.isawaitable(result):
            raise TypeError("a plain def handler returned an awaitable; declare it async def")
        return result

    async def _confirm_if_late(self) -> bool:
        """The long-poll's wait counts against the lease. If it ate more than half of it,
        renew with a heartbeat before starting, so a lease already lost never starts."""
        lease_ms = int(self.lease["lease_ms"])
        if self.deadline - self.loop.time() >= lease_ms / 2000.0:
            return True
        answer = await self._beat_once()
        if answer is None:
            return self.loop.time() < self.deadline
        if answer.get("cancel"):
            await self._report(CANCELLED)
            return False
        return True

    async def _beat_once(self) -> Optional[Dict[str, Any]]:
        """One heartbeat; renews the local deadline from when it was sent. None when it got
        no usable answer. A lost lease (409) cancels the attempt."""
        sent = self.loop.time()
        progress, self.progress = self.progress, None
        try:
            answer: Dict[str, Any] = await self.client.heartbeat(self.lease["lease_id"], progress)
        except ConflictError as e:
            log.info("lease %s lost (%s): stopping the handler", self.lease["lease_id"], e.detail)
            raise _Lost() from e
        except Exception as e:
            log.warning("heartbeat for lease %s failed: %s", self.lease["lease_id"], e)
            # Its progress goes with the next heartbeat, unless a newer one was given.
            if self.progress is None:
                self.progress = progress
            return None
        self.deadline = local_deadline(sent, int(answer["lease_ms"]))
        self.ctx.deadline = monotonic_of(self.loop, self.deadline)
        return answer

    async def _supervise(self, work: "asyncio.Future[Any]") -> Optional[Report]:
        """Waits for the handler while heartbeating; None means report nothing (deadline
        passed or lease lost), else the report to send."""
        beat: "Optional[asyncio.Task[Optional[Dict[str, Any]]]]" = None
        beat_at = next_beat(self.loop.time(), self.deadline, self.interval)
        try:
            while True:
                now = self.loop.time()
                if now >= self.deadline:
                    log.warning(
                        "%s/%s attempt %s: deadline passed; handler dropped, nothing reported",
                        self.ctx.job_id,
                        self.ctx.step,
                        self.ctx.attempt,
                    )
                    return None
                done, beat, beat_at = await self._wait_round(work, beat, beat_at, now)
                if work in done:
                    return _report_for(work)
                if beat is not None and beat in done:
                    try:
                        answer = beat.result()
                    except _Lost:
                        return None
                    beat = None
                    if answer is not None and answer.get("cancel"):
                        log.info(
                            "%s/%s: the job is being cancelled; stopping the handler",
                            self.ctx.job_id,
                            self.ctx.step,
                        )
                        return CANCELLED
                    beat_at = next_beat(self.loop.time(), self.deadline, self.interval)
        finally:
            if beat is not None:
                beat.cancel()

    async def _wait_round(
        self,
        work: "asyncio.Future[Any]",
        beat: "Optional[asyncio.Task[Optional[Dict[str, Any]]]]",
        beat_at: float,
        now: float,
    ) -> Tuple[Any, Any, float]:
        """Waits until the handler ends, a heartbeat answers, one is due, or the deadline."""
        if beat is None and (self.beat_now.is_set() or now >= beat_at):
            self.beat_now.clear()
            beat = self.loop.create_task(self._beat_once())
        waits: Any = {work}
        ask = None
        if beat is not None:
            waits.add(beat)
            until = self.deadline
        else:
            ask = self.loop.create_task(self.beat_now.wait())
            waits.add(ask)
            until = min(self.deadline, beat_at)
        try:
            done, _ = await asyncio.wait(
                waits, timeout=max(0.0, until - now), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if ask is not None:
                ask.cancel()
        return done, beat, beat_at


class _Lost(Exception):
    """The server says the lease is no longer ours."""


def _error_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _report_for(work: "asyncio.Future[Any]") -> Report:
    """The report for a handler that ended on its own."""
    if work.cancelled():
        return Report("fail", error="the handler was cancelled", retryable=True)
    e = work.exception()
    if e is None:
        result = work.result()
        try:
            json.dumps(result)
        except (TypeError, ValueError) as bad:
            return Report("fail", error=f"the result is not JSON: {bad}", retryable=False)
        return Report("complete", result=result)
    if isinstance(e, FatalError):
        return Report("fail", error=_error_text(e), retryable=False)
    return Report("fail", error=_error_text(e), retryable=True)

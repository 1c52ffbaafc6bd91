"""Sending what became of each attempt, in batches when many attempts end at once.

The rules, the same as the Rust SDK's: a report is never sent once its lease's local
deadline has passed (the step may belong to another attempt by then). A report that arrives
while a report call slot is free goes out at once on its own endpoint, so a quiet worker adds
no latency. While every slot is busy (at most `IN_FLIGHT` calls), reports queue up and leave
together in one `POST /v1/leases:report`, which the server fences and applies one by one in a
single commit. Whatever a batch could not settle goes back to the one-at-a-time path."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from .client import AsyncClient
from .errors import ApiError, ConflictError, TransportError
from .wire import CompleteReport, FailReport

log = logging.getLogger("overseer.reports")

TRIES = 3
IN_FLIGHT = 2
BATCH_MAX = 100


@dataclass
class Report:
    """An attempt's outcome: `complete` with a result, or `fail` with an error."""

    outcome: str
    result: Any = None
    error: str = ""
    retryable: bool = True

    def body(self, lease_id: str) -> Union[CompleteReport, FailReport]:
        if self.outcome == "complete":
            return {"outcome": "complete", "lease_id": lease_id, "result": self.result}
        return {
            "outcome": "fail",
            "lease_id": lease_id,
            "error": self.error,
            "retryable": self.retryable,
        }


@dataclass
class _Pending:
    lease_id: str
    report: Report
    deadline: float
    # None: settled (sent, refused for good, or dropped). A Report: send it on its own.
    settled: "asyncio.Future[Optional[Report]]"


def _settle(p: _Pending, back: Optional[Report]) -> None:
    # The attempt may have been abandoned (its wait cancelled) meanwhile.
    if not p.settled.done():
        p.settled.set_result(back)


def _transient(e: Exception) -> bool:
    return isinstance(e, TransportError) or (isinstance(e, ApiError) and e.status >= 500)


class Reporter:
    """One worker's report sender. `abandoned` set: nothing more is sent."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.abandoned = asyncio.Event()
        self._queue: "asyncio.Queue[_Pending]" = asyncio.Queue()
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._calls: "set[asyncio.Task[None]]" = set()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        self._task.cancel()
        for call in list(self._calls):
            call.cancel()

    async def send(self, lease_id: str, report: Report, deadline: float) -> None:
        """Reports an attempt's end; returns once the report is settled or dropped."""
        settled: "asyncio.Future[Optional[Report]]" = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(lease_id, report, deadline, settled))
        back = await settled
        if back is not None:
            await send_one(self.client, lease_id, back, deadline, self.abandoned)

    async def _loop(self) -> None:
        while True:
            # A slot first, then the queue: while both calls are busy, reports pile up and
            # leave together when one frees.
            await self._slots.acquire()
            batch = [await self._queue.get()]
            while len(batch) < BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            call = asyncio.get_running_loop().create_task(self._send_batch(batch))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _send_batch(self, batch: List[_Pending]) -> None:
        try:
            await self._settle_batch(batch)
        finally:
            self._slots.release()
            for p in batch:
                _settle(p, None)

    async def _settle_batch(self, batch: List[_Pending]) -> None:
        now = asyncio.get_running_loop().time()
        live = []
        for p in batch:
            if self.abandoned.is_set() or p.deadline <= now:
                log.warning(
                    "lease %s: local deadline passed before reporting; nothing sent", p.lease_id
                )
                _settle(p, None)
            else:
                live.append(p)
        if len(live) < 2:
            # Alone: its own call says the same with less; sent while holding the slot so
            # that reports arriving meanwhile queue up for the next batch.
            for p in live:
                await send_one(self.client, p.lease_id, p.report, p.deadline, self.abandoned)
                _settle(p, None)
            return
        last = max(p.deadline for p in live)
        call = self.client.report_batch([p.report.body(p.lease_id) for p in live])
        try:
            results = await asyncio.wait_for(call, last - now)
        except asyncio.TimeoutError:
            # Sent in time; an answer later than every deadline is not waited for, and
            # nothing is sent again.
            log.warning("no answer to a batch of %d reports before the last deadline", len(live))
            return
        except Exception as e:
            log.debug("batch report failed (%s); sending each on its own", e)
            for p in live:
                _settle(p, p.report)
            return
        if len(results) != len(live):
            log.error("batch answer has %d results for %d reports", len(results), len(live))
            for p in live:
                _settle(p, p.report)
            return
        for p, r in zip(live, results):
            ok = 200 <= int(r["status"]) < 300 or int(r["status"]) == 409
            _settle(p, None if ok else p.report)


async def send_one(
    client: AsyncClient, lease_id: str, report: Report, deadline: float, abandoned: asyncio.Event
) -> None:
    """Sends one report on its own endpoint while the local deadline allows, retrying a
    couple of times when no answer came. A 409 means the lease is someone else's now."""
    loop = asyncio.get_running_loop()
    tries = 0
    while True:
        tries += 1
        left = deadline - loop.time()
        if left <= 0 or abandoned.is_set():
            log.warning("lease %s: local deadline passed before reporting; nothing sent", lease_id)
            return
        if report.outcome == "complete":
            call = client.complete(lease_id, report.result)
        else:
            call = client.fail(lease_id, report.error, report.retryable)
        try:
            await asyncio.wait_for(call, left)
            return
        except asyncio.TimeoutError:
            log.warning(
                "lease %s: no answer to the report before the deadline; not resent", lease_id
            )
            return
        except ConflictError as e:
            log.info(
                "lease %s: report refused (409), the lease is no longer ours: %s",
                lease_id,
                e.detail,
            )
            return
        except Exception as e:
            if _transient(e) and tries < TRIES:
                await asyncio.sleep((0.1 * 2**tries) * random.uniform(0.5, 1.0))
                continue
            if (
                isinstance(e, ApiError)
                and report.outcome == "complete"
                and e.status in (400, 413, 422)
            ):
                # The server refuses the result itself; every attempt would do the same.
                detail = f"the server refused the step's result: {e.detail}"
                report, tries = Report("fail", error=detail, retryable=False), 0
                continue
            log.error("lease %s: report failed (%s); the lease will expire", lease_id, e)
            return

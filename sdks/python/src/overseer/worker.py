"""`Worker`: runs handlers for the steps of one or more agent names.

Each agent name has a long-poll loop; each lease runs as an attempt with its heartbeats, its
local deadline and its report. The deadline is counted on the monotonic clock from the moment
the lease request was *sent*, a little short of `lease_ms`, so this process always gives up
before the server could hand the step to someone else, whatever the wall clocks say."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import signal
import socket
from typing import Any, Awaitable, Callable, Dict, Optional, Set

import httpx

from . import _http as h
from .attempt import Attempt
from .client import AsyncClient
from .context import Context
from .errors import ApiError, TransportError
from .reports import Reporter

log = logging.getLogger("overseer.worker")

Handler = Callable[[Context], Any]
LEASES_PER_CALL = 100
BACKOFF_MAX = 5.0
# Reports that may wait for their answer per slot of `concurrency`. A report's answer takes a
# commit and a round trip, usually longer than a short handler runs, so with one report per
# slot the reports, not the handlers, set the pace: measured with the Rust SDK, a PostgreSQL
# drain (4 workers x 32) ran 6,430 steps/s with one per slot, 8,200 with four. Still bounded,
# so a server slow to answer slows the claims.
REPORTS_PER_SLOT = 4
# While the server has a backlog (the last answer filled every slot asked for), a lease request
# first lets the event loop run until this many turns in a row free no slot, so that handlers
# ending together are asked for in one request instead of one lease each. Never a timer: a slot
# still working is not waited for. Measured with the Rust SDK: a PostgreSQL drain (4 workers x
# 32) went from claims of 16 leases to 30, and a third more steps per second.
GATHER_TURNS = 2


class _Slots:
    """One agent name's `concurrency`: its poll loop asks for as many leases as there are free
    slots, and `REPORTS_PER_SLOT` reports per slot may wait for their answers (`reports`)."""

    def __init__(self, n: int) -> None:
        self.size = n
        self.free = n
        self._freed = asyncio.Event()
        self.reports = asyncio.Semaphore(n * REPORTS_PER_SLOT)

    async def take_some(self, most: int, gather: bool = False) -> int:
        """Takes the free slots, up to `most`, once at least one is; with `gather` also those
        freed while the loop runs other tasks, until `GATHER_TURNS` turns in a row free none."""
        # Only the name's poll loop waits here, so one event is enough.
        while self.free == 0:
            self._freed.clear()
            await self._freed.wait()
        enough = min(most, self.size)
        idle_turns = 0
        while gather and self.free < enough and idle_turns < GATHER_TURNS:
            before = self.free
            await asyncio.sleep(0)
            idle_turns = 0 if self.free > before else idle_turns + 1
        n = min(self.free, most)
        self.free -= n
        return n

    def give(self, n: int) -> None:
        # Not a coroutine: a slot is given back even from a task being cancelled.
        if n:
            self.free += n
            self._freed.set()


class _Held:
    """What one attempt holds of its agent name's `_Slots`: a slot while anything of it runs,
    then a report permit while its report waits for an answer. `release` gives back whatever
    is still held, so each is given back exactly once whichever way the attempt ends."""

    def __init__(self, slots: _Slots) -> None:
        self._slots = slots
        self._slot = True
        self._report = False

    async def slot_for_report(self) -> None:
        """Trades the slot for a report permit, once the attempt has nothing left to run.

        The slot is for running handlers: given back before the report is answered, the poll
        loop asks for the next lease while this report waits for the server's commit and round
        trip, which the next handler has no part in. Reports waiting are bounded too, by
        `REPORTS_PER_SLOT` per slot: when every permit is taken, the slot is kept until a report
        is answered, so a server slow to settle reports slows the claims down with it."""
        if not self._slot or self._report:
            return
        # Cancelled while waiting (abandon), nothing is taken and `release` frees the slot.
        await self._slots.reports.acquire()
        self._report = True
        self._give_slot()

    def release(self) -> None:
        self._give_slot()
        if self._report:
            self._report = False
            self._slots.reports.release()

    def _give_slot(self) -> None:
        if self._slot:
            self._slot = False
            self._slots.give(1)


class Worker:
    """Registers handlers per agent name and runs them.

    `server` is one URL or several (failed over in turn); `concurrency` is the number of
    handlers of each agent name running at once (each name has its own long-poll loop and
    its own slots, so an idle name never holds back a busy one). A slot is free again as soon
    as its handler returns, and `REPORTS_PER_SLOT` reports per slot may wait for their answers;
    when that many do, a finished attempt keeps its slot until one is answered. While the
    server has a backlog, a lease request first lets handlers that are ending finish
    (`gather`, default on; never a timer), so it asks for many leases at once. Plain `def`
    handlers run in a thread pool; `async def` handlers run on the worker's event loop."""

    def __init__(
        self,
        server: h.Servers = None,
        token: Optional[str] = None,
        worker_id: Optional[str] = None,
        concurrency: int = 4,
        poll_wait: float = 20.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        gather: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.servers = h.resolve_servers(server)
        self.token = token
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-py"
        self.concurrency = concurrency
        self.poll_wait = poll_wait
        self.gather = gather
        self.transport = transport
        self.handlers: Dict[str, Handler] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._attempts: Set["asyncio.Task[None]"] = set()
        self._contexts: Set[Context] = set()
        self._reporter: Optional[Reporter] = None
        self._signals = 0
        self._stop_requested = False

    def handler(self, agent: str) -> Callable[[Handler], Handler]:
        """Decorator: `@worker.handler("dns")` runs the function for steps of agent `dns`."""

        def register(fn: Handler) -> Handler:
            self.handlers[agent] = fn
            return fn

        return register

    def run(self, install_signals: bool = True) -> None:
        """Runs until stopped: SIGINT/SIGTERM (or `stop()`) stops taking work and lets the
        running attempts finish and report; a second signal (or `abandon()`) drops them."""
        asyncio.run(self.run_async(install_signals))

    def stop(self) -> None:
        """Graceful stop; safe from any thread, also before the worker has started."""
        self._stop_requested = True
        self._call_in_loop(self._begin_stop)

    def abandon(self) -> None:
        """Drops every running attempt without reporting (their leases will expire)."""
        self._call_in_loop(self._abandon)

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn)

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("stopping: finishing the running attempts (signal again to abandon them)")
            self._begin_stop()
        else:
            log.warning("abandoning the running attempts")
            self._abandon()

    def _begin_stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def _abandon(self) -> None:
        self._begin_stop()
        if self._reporter is not None:
            self._reporter.abandoned.set()
        for ctx in list(self._contexts):
            ctx._cancel()
        for task in list(self._attempts):
            task.cancel()

    async def run_async(self, install_signals: bool = False) -> None:
        """The worker on the running event loop, until `stop()` and the attempts are done."""
        if not self.handlers:
            raise ValueError("no handler registered")
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._signals = 0
        if self._stop_requested:
            self._stopping.set()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(sig, self._on_signal)
        # Room beyond the slots for sync handlers still running after being dropped.
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2 * self.concurrency * len(self.handlers),
            thread_name_prefix="overseer-handler",
        )
        client = AsyncClient(self.servers, self.token, transport=self.transport)
        self._reporter = Reporter(client)
        try:
            polls = [
                self._poll(client, pool, _Slots(self.concurrency), agent) for agent in self.handlers
            ]
            await asyncio.gather(*polls)
            while self._attempts:
                await asyncio.gather(*list(self._attempts), return_exceptions=True)
        finally:
            if install_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self._loop.remove_signal_handler(sig)
            await self._reporter.close()
            await client.aclose()
            # Threads of abandoned sync handlers are not waited for.
            pool.shutdown(wait=False)
            self._stop_requested = False

    async def _poll(
        self,
        client: AsyncClient,
        pool: concurrent.futures.Executor,
        slots: _Slots,
        agent: str,
    ) -> None:
        """One agent name's long-poll loop: takes as many leases as there are free slots."""
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        backoff = 0.1
        backlog = False
        while not self._stopping.is_set():
            gather = self.gather and backlog
            n = await self._until_stopped(slots.take_some(LEASES_PER_CALL, gather))
            if n is None:
                return
            sent_at = loop.time()
            try:
                leases = await self._until_stopped(
                    client.take_leases(agent, self.worker_id, n, self.poll_wait)
                )
            except (TransportError, ApiError) as e:
                backlog = False
                slots.give(n)
                if isinstance(e, ApiError) and e.status < 500 and e.status != 429:
                    log.error("agent %s: lease request refused: %s", agent, e)
                # Unreachable or overloaded: back off (jittered) and try the next server.
                if isinstance(e, TransportError):
                    client.rotate()
                log.warning(
                    "agent %s: cannot take leases (%s); retrying in %.1fs", agent, e, backoff
                )
                await self._until_stopped(asyncio.sleep(backoff * random.uniform(0.5, 1.0)))
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if leases is None:
                slots.give(n)
                return
            backoff = 0.1
            backlog = len(leases) >= n
            slots.give(n - len(leases))
            for lease in leases:
                self._start_attempt(client, pool, slots, lease, sent_at)

    async def _until_stopped(self, aw: Awaitable[Any]) -> Any:
        """`aw`'s value, or None once the worker is stopping (then `aw` is cancelled)."""
        assert self._stopping is not None
        work = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        done, _ = await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if work in done:
            return work.result()
        work.cancel()
        # A lease request cancelled this way may have been granted: that attempt expires.
        return None

    def _start_attempt(
        self,
        client: AsyncClient,
        pool: concurrent.futures.Executor,
        slots: _Slots,
        lease: Dict[str, Any],
        sent_at: float,
    ) -> None:
        assert self._reporter is not None
        held = _Held(slots)
        attempt = Attempt(
            client,
            self._reporter,
            pool,
            self.handlers[lease["agent"]],
            lease,
            sent_at,
            before_report=held.slot_for_report,
        )
        self._contexts.add(attempt.ctx)

        async def run() -> None:
            try:
                await attempt.run()
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("attempt %s/%s crashed", lease["job_id"], lease["step"])
            finally:
                self._contexts.discard(attempt.ctx)
                held.release()

        task = asyncio.get_running_loop().create_task(run())
        self._attempts.add(task)
        task.add_done_callback(self._attempts.discard)

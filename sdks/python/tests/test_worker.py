"""The worker against a real server: DAGs, retries, compensation, deadlines, cancels, batches."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List

from conftest import Recorder, load_example, running, step, wait_until

from overseer import Client, Context, FatalError, RetryableError, Worker
from overseer.worker import REPORTS_PER_SLOT


def test_walkthrough_job_runs_on_python_workers(server: Any, client: Client) -> None:
    # Proves the README walkthrough's job runs entirely on Python handlers: the two middle
    # steps run at the same time (a barrier only both can pass), each step gets its
    # dependencies' results as inputs, and sync and async handlers both work.
    both_middle = threading.Barrier(2, timeout=10)
    worker = Worker(server.url, concurrency=4)

    @worker.handler("accounts")
    async def accounts(ctx: Context) -> Dict[str, Any]:
        return {"account_id": "acc-" + ctx.payload["customer"], "key": ctx.idempotency_key}

    @worker.handler("dns")
    def dns(ctx: Context) -> Dict[str, Any]:
        both_middle.wait()
        return {"records": ["A"], "for": ctx.inputs["create-account"]["account_id"]}

    @worker.handler("storage")
    def storage(ctx: Context) -> Dict[str, Any]:
        both_middle.wait()
        return {"bucket": ctx.payload["bucket"], "for": ctx.inputs["create-account"]["account_id"]}

    @worker.handler("deploy")
    async def deploy(ctx: Context) -> Dict[str, Any]:
        return {"url": "https://acme.example.com", "saw": sorted(ctx.inputs)}

    with running(worker):
        job = client.submit(load_example("provision-site.json"))
        done = client.wait(job["id"], timeout=30)
    assert done["state"] == "succeeded", done
    assert step(done, "create-account")["result"]["key"] == f"{job['id']}/create-account"
    assert step(done, "provision-dns")["result"]["for"] == "acc-acme"
    assert step(done, "provision-storage")["result"]["bucket"] == "acme-site"
    assert step(done, "deploy-site")["result"]["saw"] == ["provision-dns", "provision-storage"]


def test_retryable_error_then_success(server: Any, client: Client) -> None:
    # Proves a RetryableError (and any plain exception) fails the attempt retryably: the step
    # runs again and succeeds on attempt 3, with the earlier error kept in the history.
    worker = Worker(server.url)
    seen: List[int] = []

    @worker.handler("flaky")
    def flaky(ctx: Context) -> Any:
        seen.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RetryableError("upstream busy")
        if ctx.attempt == 2:
            raise KeyError("boom")
        return {"ok": ctx.attempt}

    spec = {
        "steps": [{"name": "s", "agent": "flaky", "backoff": {"initial": "50ms", "max": "50ms"}}]
    }
    with running(worker):
        job = client.wait(client.submit(spec)["id"], timeout=30)
    assert job["state"] == "succeeded", job
    assert step(job, "s")["result"] == {"ok": 3}
    assert seen == [1, 2, 3]
    errors = [e for e in client.events(job["id"]) if "upstream busy" in str(e)]
    assert errors, "the first attempt's error is in the history"


def test_fatal_error_fails_job_and_compensates(server: Any, client: Client) -> None:
    # Proves FatalError fails the step for good (no second attempt) and the succeeded step
    # before it is undone by its compensation handler, which gets kind "compensate" and the
    # undone step's result as input.
    worker = Worker(server.url)
    undone: List[Context] = []
    charge_attempts: List[int] = []

    @worker.handler("billing")
    def reserve(ctx: Context) -> Any:
        return {"reservation": "r-1"}

    @worker.handler("charge")
    def charge(ctx: Context) -> Any:
        charge_attempts.append(ctx.attempt)
        raise FatalError("card declined")

    @worker.handler("billing-undo")
    async def undo(ctx: Context) -> Any:
        undone.append(ctx)
        return {"released": True}

    spec = {
        "steps": [
            {
                "name": "reserve",
                "agent": "billing",
                "compensate": {"agent": "billing-undo", "payload": {"why": "rollback"}},
            },
            {"name": "charge", "agent": "charge", "depends_on": ["reserve"]},
        ]
    }
    with running(worker):
        job = client.wait(client.submit(spec)["id"], timeout=30)
    assert job["state"] == "failed", job
    assert job["compensated"] == ["reserve"], job
    assert charge_attempts == [1]
    assert "card declined" in step(job, "charge")["last_error"]
    assert len(undone) == 1 and undone[0].kind == "compensate"
    assert undone[0].payload == {"why": "rollback"}
    assert undone[0].idempotency_key == f"{job['id']}/reserve/compensate"
    assert any(v == {"reservation": "r-1"} for v in undone[0].inputs.values()), undone[0].inputs


def test_handler_past_deadline_never_reports(server: Any, client: Client) -> None:
    # Proves nothing is reported after the local deadline, for an async and a sync handler:
    # attempt 1's heartbeats are cut (a partition for those leases only), so the deadline
    # passes while the handlers hang; the async one is cancelled, the sync one sees
    # `cancelled` and returns late. The recorder shows no complete/fail for those leases,
    # and the server re-leases each step as attempt 2, whose result is the one kept.
    recorder = Recorder()
    worker = Worker(server.url, concurrency=4, transport=recorder)
    first: Dict[str, str] = {}
    async_cancelled = threading.Event()
    sync_returned = threading.Event()

    @worker.handler("slow-async")
    async def slow_async(ctx: Context) -> Any:
        if ctx.attempt == 1:
            recorder.cut_heartbeats.add(ctx.lease_id)
            first["async"] = ctx.lease_id
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                async_cancelled.set()
                raise
        return {"attempt": ctx.attempt}

    @worker.handler("slow-sync")
    def slow_sync(ctx: Context) -> Any:
        if ctx.attempt == 1:
            recorder.cut_heartbeats.add(ctx.lease_id)
            first["sync"] = ctx.lease_id
            assert ctx.cancel_event.wait(60)
            sync_returned.set()
            return {"late": True}
        return {"attempt": ctx.attempt}

    back = {"initial": "50ms", "max": "50ms"}
    spec = {
        "steps": [
            {"name": "a", "agent": "slow-async", "timeout": "1s", "backoff": back},
            {"name": "s", "agent": "slow-sync", "timeout": "1s", "backoff": back},
        ]
    }
    with running(worker):
        job = client.wait(client.submit(spec)["id"], timeout=30)
        assert async_cancelled.wait(5) and sync_returned.wait(5)
    assert job["state"] == "succeeded", job
    for name in ("a", "s"):
        assert step(job, name)["attempt"] == 2, job
        assert step(job, name)["result"] == {"attempt": 2}, job
    for lease_id in first.values():
        assert recorder.reports_for(lease_id) == [], "a report was sent past the deadline"


def test_cancel_via_heartbeat_stops_handlers(server: Any, client: Client) -> None:
    # Proves a heartbeat answering `cancel: true` cancels an async handler and sets a sync
    # handler's cancelled flag, that the sync handler's later return is not reported as a
    # completion, and that the job ends cancelled quickly (the attempts report "cancelled").
    recorder = Recorder()
    worker = Worker(server.url, concurrency=2, transport=recorder)
    started = threading.Barrier(3, timeout=10)
    async_cancelled = threading.Event()
    leases: List[str] = []

    @worker.handler("wait-async")
    async def wait_async(ctx: Context) -> Any:
        leases.append(ctx.lease_id)
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            async_cancelled.set()
            raise

    @worker.handler("wait-sync")
    def wait_sync(ctx: Context) -> Any:
        leases.append(ctx.lease_id)
        started.wait()
        assert ctx.cancel_event.wait(60)
        return {"finished": "anyway"}

    spec = {
        "steps": [
            {"name": "a", "agent": "wait-async", "timeout": "900ms"},
            {"name": "s", "agent": "wait-sync", "timeout": "900ms"},
        ]
    }
    with running(worker):
        job_id = client.submit(spec)["id"]
        started.wait()
        client.cancel(job_id)
        job = client.wait(job_id, timeout=20)
        assert async_cancelled.wait(5)
    assert job["state"] == "cancelled", job
    for lease_id in leases:
        sent = recorder.reports_for(lease_id)
        assert sent, "each attempt reported its cancel"
        assert all(r["outcome"] == "fail" and r["error"] == "cancelled" for r in sent), sent


def test_reports_are_batched_under_load(server: Any, client: Client) -> None:
    # Proves reports that queue up behind the calls in flight leave together: 300 one-step
    # jobs worked with concurrency 32 all succeed, the recorder sees POST /v1/leases:report
    # carrying several reports, and every lease was reported exactly once.
    recorder = Recorder()
    worker = Worker(server.url, concurrency=32, transport=recorder)

    @worker.handler("quick")
    async def quick(ctx: Context) -> Any:
        return ctx.payload["n"]

    specs = [
        {"labels": {"load": "yes"}, "steps": [{"name": "s", "agent": "quick", "payload": {"n": i}}]}
        for i in range(300)
    ]
    with running(worker):
        jobs = client.submit_batch(specs)
        for job in jobs:
            assert client.wait(job["id"], timeout=60)["state"] == "succeeded"
    assert recorder.count("/v1/leases:report") >= 1
    batched = [r for r in recorder.sent if r["path"] == "/v1/leases:report"]
    assert max(len(r["body"]["reports"]) for r in batched) >= 2
    leases = {r["path"].split("/")[3] for r in recorder.sent if r["path"].endswith("/complete")}
    in_batches = [x["lease_id"] for r in batched for x in r["body"]["reports"]]
    assert len(in_batches) == len(set(in_batches)) and not leases & set(in_batches)
    assert len(leases) + len(in_batches) == 300


def test_context_heartbeat_sends_progress(server: Any, client: Client) -> None:
    # Proves ctx.heartbeat(progress=...) from a sync handler sends a heartbeat at once (long
    # before the periodic one, the step's timeout being 30 s) carrying the progress.
    recorder = Recorder()
    worker = Worker(server.url, transport=recorder)

    def beats() -> List[Any]:
        with recorder.lock:
            return [r["body"] for r in recorder.sent if r["path"].endswith("/heartbeat")]

    @worker.handler("progress")
    def work(ctx: Context) -> Any:
        ctx.heartbeat(progress={"pct": 50})
        wait_until("the progress heartbeat", lambda: {"progress": {"pct": 50}} in beats(), 10)
        return "done"

    with running(worker):
        job = client.wait(
            client.submit({"steps": [{"name": "s", "agent": "progress"}]})["id"], timeout=30
        )
    assert job["state"] == "succeeded", job


def test_context_progress_goes_with_the_next_heartbeat(server: Any, client: Client) -> None:
    # Proves ctx.progress(value) asks for no heartbeat of its own: the next regular one carries
    # it, once; the server keeps it on the step (and records it for a step with
    # `progress_events`).
    recorder = Recorder()
    worker = Worker(server.url, transport=recorder)

    def beats() -> List[Any]:
        with recorder.lock:
            return [r["body"] for r in recorder.sent if r["path"].endswith("/heartbeat")]

    @worker.handler("progress-later")
    def work(ctx: Context) -> Any:
        ctx.progress({"pct": 25})
        wait_until("two heartbeats", lambda: len(beats()) >= 2, 10)
        return "done"

    spec = {"steps": [{"name": "s", "agent": "progress-later", "timeout": "1s",
                       "progress_events": True}]}
    with running(worker):
        job = client.wait(client.submit(spec)["id"], timeout=30)
    assert job["state"] == "succeeded", job
    carried = [b.get("progress") for b in beats() if b and "progress" in b]
    assert carried == [{"pct": 25}], beats()
    assert step(job, "s")["progress"] == {"pct": 25} and step(job, "s")["progress_at"], job
    kinds = [e["kind"] for e in client.events(job["id"])]
    assert kinds.count("step_progress") == 1, kinds


class HeldReports(Recorder):
    """A recorder whose report requests (complete, fail, leases:report) reach the server at
    once but get their answers only when let through: one at a time by `answer_one` (the
    longest held first), all from then on by `answer_all`. A server slow to settle reports."""

    def __init__(self) -> None:
        super().__init__()
        self.unanswered = 0
        self._answers = threading.Condition(self.lock)
        self._held: List[int] = []
        self._tickets = 0
        self._let_through = 0
        self._all = False

    def answer_one(self) -> None:
        with self._answers:
            self._let_through += 1
            self._answers.notify_all()

    def answer_all(self) -> None:
        with self._answers:
            self._all = True
            self._answers.notify_all()

    def _wait_for_answer(self, ticket: int) -> None:
        # Runs in a thread: the worker's event loop goes on meanwhile.
        with self._answers:
            self._held.append(ticket)

            def free() -> bool:
                return self._all or (self._let_through > 0 and self._held[0] == ticket)

            self._answers.wait_for(free, timeout=30)
            if not self._all and self._let_through > 0 and self._held[0] == ticket:
                self._let_through -= 1
            self._held.remove(ticket)
            self._answers.notify_all()

    async def handle_async_request(self, request: Any) -> Any:
        path = request.url.path
        if not (path.endswith(("/complete", "/fail")) or path == "/v1/leases:report"):
            return await super().handle_async_request(request)
        with self.lock:
            self.unanswered += 1
            self._tickets += 1
            ticket = self._tickets
        try:
            response = await super().handle_async_request(request)
            await asyncio.get_running_loop().run_in_executor(
                None, self._wait_for_answer, ticket
            )
            return response
        finally:
            with self.lock:
                self.unanswered -= 1


def test_slot_is_free_while_the_report_waits_for_its_answer(server: Any, client: Client) -> None:
    # Proves a slot bounds the running handlers, not the reports, and that the reports waiting
    # for their answers are bounded by REPORTS_PER_SLOT per slot. With concurrency 1 and report
    # answers held back, REPORTS_PER_SLOT + 1 handlers start while no report is answered: the
    # first REPORTS_PER_SLOT attempts each take a report permit and give back the slot, and
    # the next one runs its handler, then keeps the slot while it waits for a permit. So no
    # further handler starts until a report is answered; once one answer is let through,
    # exactly one more starts (it too then waits for a permit). Once the answers flow, every
    # job finishes.
    transport = HeldReports()
    worker = Worker(server.url, concurrency=1, transport=transport)
    lock = threading.Lock()
    started: List[int] = []
    returned: List[int] = []
    # Leases that start before any answer: one per report permit, and one more that ends and
    # then holds the only slot while it waits for a permit. Then one that a single answer
    # lets start, and one more that must still wait.
    early = REPORTS_PER_SLOT + 1
    total = early + 2

    @worker.handler("one-at-a-time")
    def work(ctx: Context) -> Any:
        with lock:
            started.append(ctx.payload["n"])
        with lock:
            returned.append(ctx.payload["n"])
        return ctx.payload["n"]

    def count(xs: List[int]) -> int:
        with lock:
            return len(xs)

    def happens_within(cond: Any, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if cond():
                return True
            time.sleep(0.02)
        return bool(cond())

    def unanswered() -> int:
        with transport.lock:
            return transport.unanswered

    specs = [{"steps": [{"name": "s", "agent": "one-at-a-time", "payload": {"n": n}}]}
             for n in range(total)]
    with running(worker):
        try:
            # The first job alone, so its report is held before the others come.
            job_ids = [client.submit(specs[0])["id"]]
            wait_until("the first report to be sent", lambda: unanswered() == 1, 10)
            job_ids += [client.submit(s)["id"] for s in specs[1:]]
            wait_until(f"{early} handlers to start while no report is answered",
                       lambda: count(started) >= early, 10)
            wait_until(f"{early} handlers to return", lambda: count(returned) >= early, 10)
            # The last of them has ended and waits for a report permit, keeping its slot.
            assert not happens_within(lambda: count(started) > early, 1.0), (
                f"a handler past {early} ran while {REPORTS_PER_SLOT} reports were unanswered"
            )
            # All but the last started attempt have a report waiting for its answer.
            assert count(started) - 1 > 1, "more reports wait for answers than there are slots"
            assert unanswered() >= 1, "a report was answered while held"
            transport.answer_one()
            wait_until("the next handler to start once a report is answered",
                       lambda: count(started) >= early + 1, 10)
            assert not happens_within(lambda: count(started) > early + 1, 1.0), (
                "one answer let more than one more handler start"
            )
        finally:
            transport.answer_all()
        jobs = [client.wait(job_id, timeout=30) for job_id in job_ids]
    assert [(j["state"], step(j, "s")["result"]) for j in jobs] == [
        ("succeeded", n) for n in range(total)
    ], jobs


def test_a_lease_request_gathers_the_slots_of_ending_handlers() -> None:
    # Proves the poll loop's slot gathering: with `gather` it also takes the slots that handlers
    # ending now free while it lets them run; a slot still working is not waited for (no
    # timer); without `gather` it takes what is free at once.
    from overseer.worker import _Slots

    async def ends_after_a_turn(slots: _Slots) -> None:
        await asyncio.sleep(0)
        slots.give(1)

    async def scenario() -> None:
        slots = _Slots(4)
        loop = asyncio.get_running_loop()
        assert await slots.take_some(100) == 4
        slots.give(1)
        ending = [asyncio.ensure_future(ends_after_a_turn(slots)) for _ in range(3)]
        assert await slots.take_some(100, gather=True) == 4
        await asyncio.gather(*ending)
        slots.give(1)
        loop.call_later(5.0, slots.give, 3)
        started = loop.time()
        assert await slots.take_some(100, gather=True) == 1
        assert loop.time() - started < 1.0, "busy slots are not waited for"
        slots.give(1)
        ending = [asyncio.ensure_future(ends_after_a_turn(slots))]
        assert await slots.take_some(100) == 1, "no gathering without a backlog"
        await asyncio.gather(*ending)

    asyncio.run(scenario())

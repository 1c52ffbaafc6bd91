"""The client's calls against a real server, and its errors."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List

import httpx
import pytest
from conftest import running, step

from overseer import (
    ApiError,
    AsyncClient,
    Client,
    ConflictError,
    FatalError,
    NotFoundError,
    Worker,
)

ONE = {"steps": [{"name": "s", "agent": "nobody"}]}


def test_errors_carry_problem_fields(client: Client) -> None:
    # Proves errors are exceptions with the server's problem+json fields: a bad spec names the
    # field at fault, an unknown job is NotFoundError, a reused idempotency key with another
    # body and a cancel of a finished job are ConflictError.
    bad = {
        "steps": [{"name": "a", "agent": "x"}, {"name": "b", "agent": "x", "depends_on": ["zz"]}]
    }
    with pytest.raises(ApiError) as e:
        client.submit(bad)
    assert e.value.status in (400, 422) and e.value.field == "steps[1].depends_on[0]", vars(e.value)
    assert e.value.title and e.value.detail and e.value.type
    with pytest.raises(NotFoundError) as nf:
        client.get("00000000-0000-0000-0000-000000000000")
    assert nf.value.status == 404
    client.submit({**ONE, "idempotency_key": "k1"})
    with pytest.raises(ConflictError) as c:
        client.submit({"idempotency_key": "k1", "steps": [{"name": "t", "agent": "nobody"}]})
    assert c.value.status == 409 and c.value.detail
    job = client.submit(ONE)
    client.cancel(job["id"])
    assert client.wait(job["id"], timeout=10)["state"] == "cancelled"
    with pytest.raises(ConflictError):
        client.cancel(job["id"])


def test_list_pages_wait_and_events(client: Client) -> None:
    # Proves batch submit, label filters, cursor paging (the iterator walks every page), a
    # wait that returns the job non-terminal once the caller's timeout passes, and events.
    jobs = client.submit_batch([{**ONE, "labels": {"batch": "b1", "n": str(i)}} for i in range(5)])
    assert len(jobs) == 5
    client.submit({**ONE, "labels": {"batch": "other"}})
    page = client.list(label={"batch": "b1"}, limit=2)
    assert len(page["jobs"]) == 2 and page["next_cursor"]
    every = list(client.iter_jobs(label="batch:b1", page_size=2))
    assert sorted(j["id"] for j in every) == sorted(j["id"] for j in jobs)
    assert len(list(client.iter_jobs(state="succeeded"))) == 0
    # Under `Prefer: return=minimal` a batch answers ids, states and `created` only.
    brief = client.submit_batch_minimal([{**ONE, "labels": {"batch": "b2"}}] * 3)
    assert [sorted(j) for j in brief] == [["created", "id", "state"]] * 3
    assert all(j["created"] for j in brief)
    assert client.get(brief[0]["id"])["labels"] == {"batch": "b2"}
    started = time.monotonic()
    waited = client.wait(jobs[0]["id"], timeout=0.5)
    assert waited["state"] not in ("succeeded", "failed", "cancelled")
    assert 0.4 < time.monotonic() - started < 5
    events = client.events(jobs[0]["id"])
    assert "job_submitted" in str(events[0]), events


def test_operator_actions_on_blocked_job(server: Any, client: Client) -> None:
    # Proves retry/skip/resume reach the server with `by`/`reason` recorded: a step failed
    # for good under on_failure=hold blocks the job; skip lets it finish.
    spec = {"on_failure": "hold", "steps": [{"name": "s", "agent": "hold-me", "max_attempts": 1}]}
    job_id = client.submit(spec)["id"]
    worker = Worker(server.url)

    @worker.handler("hold-me")
    def fail(ctx: Any) -> Any:
        raise RuntimeError("nope")

    with running(worker):
        deadline = time.monotonic() + 20
        while client.get(job_id)["state"] != "blocked":
            assert time.monotonic() < deadline, client.get(job_id)
            client.wait(job_id, timeout=0.2)
    with pytest.raises(NotFoundError):
        client.skip_step(job_id, "no-such-step", by="ops")
    client.skip_step(job_id, "s", by="alice", reason="not needed")
    job = client.wait(job_id, timeout=10)
    assert job["state"] == "succeeded" and step(job, "s")["state"] == "skipped", job
    assert "alice" in str(client.events(job_id))


def test_rerun_from_failure_keeps_what_succeeded(server: Any, client: Client) -> None:
    # Proves Client.rerun: a failed job's rerun from failure is linked both ways, keeps the step
    # that succeeded (its handler never runs again) and runs the failed one; a second rerun is
    # refused with 409.
    spec = {
        "on_failure": "fail",
        "steps": [
            {"name": "a", "agent": "py-rerun"},
            {"name": "b", "agent": "py-rerun", "depends_on": ["a"], "max_attempts": 1},
        ],
    }
    runs: List[str] = []
    fixed = threading.Event()
    worker = Worker(server.url)

    @worker.handler("py-rerun")
    def work(ctx: Any) -> Any:
        runs.append(f"{ctx.job_id}/{ctx.step}")
        if ctx.step == "b" and not fixed.is_set():
            raise FatalError("b is broken")
        return {"made": ctx.step}

    with running(worker):
        old = client.wait(client.submit(spec)["id"], timeout=30)
        assert old["state"] == "failed", old
        fixed.set()
        new = client.rerun(old["id"], from_failed=True, by="py", reason="fixed")
        assert new["rerun_of"] == old["id"] and step(new, "a")["state"] == "succeeded", new
        done = client.wait(new["id"], timeout=30)
    assert done["state"] == "succeeded", done
    assert client.get(old["id"])["rerun_by"] == new["id"]
    assert f"{new['id']}/a" not in runs and f"{new['id']}/b" in runs, runs
    with pytest.raises(ConflictError) as refused:
        client.rerun(old["id"])
    assert "already rerun" in refused.value.detail, refused.value


def test_agents_limits_and_schedules(client: Client) -> None:
    # Proves agent limits round-trip, pause/resume flip `paused`, and schedules can be
    # created, listed, fetched, replaced (a paused one stays paused), paused, resumed and
    # deleted (then 404).
    limits = client.set_limits("dns", max_concurrency=2, rate=5.0)
    assert limits["max_concurrency"] == 2 and limits["rate"] == 5.0
    assert client.get_limits("dns")["max_concurrency"] == 2
    assert client.pause_agent("dns")["paused"] is True
    assert client.resume_agent("dns")["paused"] is False
    sched = {"name": "nightly", "cron": "0 30 2 * * *", "job": ONE}
    client.create_schedule(sched)
    assert [s["name"] for s in client.list_schedules()] == ["nightly"]
    assert client.get_schedule("nightly")["name"] == "nightly"
    assert client.pause_schedule("nightly")["paused"] is True
    replaced = client.update_schedule("nightly", {"cron": "@daily", "job": ONE})
    assert replaced["cron"] == "@daily" and replaced["paused"] is True, replaced
    assert replaced["next_fire_at"] is None, replaced
    assert client.resume_schedule("nightly")["paused"] is False
    assert client.get_schedule("nightly")["next_fire_at"].endswith("T00:00:00.000Z")
    client.delete_schedule("nightly")
    with pytest.raises(NotFoundError):
        client.get_schedule("nightly")


def test_token_is_sent_and_async_client_works(server: Any, monkeypatch: Any) -> None:
    # Proves the bearer token (here from OVERSEER_TOKEN) and OVERSEER_SERVER are honoured,
    # by recording the headers of real requests, and that AsyncClient answers like Client.
    seen: List[Dict[str, str]] = []

    class Spy(httpx.AsyncBaseTransport):
        inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(dict(request.headers))
            return await self.inner.handle_async_request(request)

    monkeypatch.setenv("OVERSEER_TOKEN", "s3cret")
    monkeypatch.setenv("OVERSEER_SERVER", server.url)

    async def main() -> None:
        async with AsyncClient(transport=Spy()) as c:
            job = await c.submit(ONE)
            assert (await c.get(job["id"]))["id"] == job["id"]
            ids = [j["id"] async for j in c.iter_jobs(page_size=1)]
            assert ids == [job["id"]]
            with pytest.raises(NotFoundError):
                await c.get_schedule("none")

    asyncio.run(main())
    assert seen and all(h.get("authorization") == "Bearer s3cret" for h in seen)

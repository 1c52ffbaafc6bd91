"""Worker processes that die or are told to stop, and a worker that fails over."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List

from conftest import free_port, running, step

from overseer import Client, Context, Worker

PROC = str(Path(__file__).with_name("worker_proc.py"))


def start_proc(url: str, mode: str) -> "subprocess.Popen[str]":
    return subprocess.Popen([sys.executable, PROC, url, mode], stdout=subprocess.PIPE, text=True)


def read_until(proc: "subprocess.Popen[str]", prefix: str) -> None:
    """Reads the process's output up to a line starting with `prefix`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"the worker process ended before printing {prefix!r}")


def test_killed_worker_step_is_released_and_done_by_another(server: Any, client: Client) -> None:
    # Proves a worker killed with SIGKILL mid-step loses nothing: once the step's timeout
    # passes, the server re-leases it (attempt 2) to another worker, which completes it.
    spec = {
        "steps": [
            {
                "name": "s",
                "agent": "victim",
                "timeout": "1s",
                "backoff": {"initial": "50ms", "max": "50ms"},
            }
        ]
    }
    job_id = client.submit(spec)["id"]
    proc = start_proc(server.url, "hang")
    read_until(proc, "started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    worker = Worker(server.url, worker_id="rescuer")
    took: List[int] = []

    @worker.handler("victim")
    def rescue(ctx: Context) -> Any:
        took.append(ctx.attempt)
        return {"by": "rescuer"}

    with running(worker):
        job = client.wait(job_id, timeout=30)
    assert job["state"] == "succeeded", job
    assert step(job, "s")["attempt"] == 2
    assert step(job, "s")["result"] == {"by": "rescuer"}
    assert took == [2]


def test_sigterm_lets_running_handler_finish_and_report(server: Any, client: Client) -> None:
    # Proves graceful shutdown: SIGTERM while a handler runs stops polling but lets the
    # handler finish; its result is reported (attempt 1 succeeds) and the process exits 0.
    job_id = client.submit({"steps": [{"name": "s", "agent": "victim", "timeout": "10s"}]})["id"]
    proc = start_proc(server.url, "slow")
    read_until(proc, "started")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "exited" in out, out
    job = client.get(job_id)
    assert job["state"] == "succeeded", job
    assert step(job, "s")["result"] == {"by": "proc", "attempt": 1}


def test_second_signal_abandons_running_handler(server: Any, client: Client) -> None:
    # Proves a second SIGTERM abandons a running handler at once: the process exits without
    # reporting, so the step is still running on the server under attempt 1.
    job_id = client.submit({"steps": [{"name": "s", "agent": "victim", "timeout": "30s"}]})["id"]
    proc = start_proc(server.url, "hang")
    read_until(proc, "started")
    proc.send_signal(signal.SIGTERM)
    # Signals of one kind do not queue: send the second only once the first was handled.
    read_until(proc, "stopping")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "exited" in out, out
    job = client.get(job_id)
    assert job["state"] == "running" and step(job, "s")["state"] == "running", job


def test_worker_fails_over_to_the_next_server(server: Any, client: Client) -> None:
    # Proves a worker given several URLs moves past one nobody listens on and works the job
    # through the live server.
    dead = f"http://127.0.0.1:{free_port()}"
    worker = Worker([dead, server.url])

    @worker.handler("any")
    async def any_step(ctx: Context) -> Any:
        return "ok"

    with running(worker):
        job = client.wait(
            client.submit({"steps": [{"name": "s", "agent": "any"}]})["id"], timeout=30
        )
    assert job["state"] == "succeeded", job


def test_worker_reconnects_after_server_restart(server: Any, client: Client) -> None:
    # Proves a worker rides out its server going away: the server is killed while the worker
    # long-polls and started again on the same port and database; the worker keeps retrying
    # with backoff and works a job submitted after the restart.
    worker = Worker(server.url, poll_wait=1.0)

    @worker.handler("any")
    async def any_step(ctx: Context) -> Any:
        return {"attempt": ctx.attempt}

    with running(worker):
        first = client.submit({"steps": [{"name": "s", "agent": "any"}]})["id"]
        assert client.wait(first, timeout=30)["state"] == "succeeded"
        server.kill()
        server.start_again()
        job = client.wait(
            client.submit({"steps": [{"name": "s", "agent": "any"}]})["id"], timeout=30
        )
    assert job["state"] == "succeeded", job

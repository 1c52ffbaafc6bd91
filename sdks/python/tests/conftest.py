"""Fixtures: a real `overseer server` process per test, and a way to record what the
worker sends over HTTP."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set

import httpx
import pytest

from overseer import Client, Worker

REPO = Path(__file__).resolve().parents[3]


_PORT_SPAN = 10_000
_next_port = itertools.count()


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (`ip_local_port_range`)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A free loopback port from below the ephemeral range.

    A port the kernel handed out for `bind(0)` and that was then closed can be handed out
    again at once, to any outgoing connection, before the server started on it binds it.
    Ports below the ephemeral range are never handed out that way; the pid spreads
    concurrent test processes over the span.
    """
    below = _ephemeral_low() - _PORT_SPAN
    if below < 1024:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    start = os.getpid() * 7_919
    for _ in range(_PORT_SPAN):
        port = below + (start + next(_next_port)) % _PORT_SPAN
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {below}..{below + _PORT_SPAN}")


class Server:
    def __init__(self, tmp: Path) -> None:
        binary = os.environ.get("OVERSEER_BIN")
        if not binary:
            pytest.fail("set OVERSEER_BIN to the overseer binary (scripts/test-sdk-python.sh does)")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(tmp / "server.log", "ab")
        self.argv = [
            binary,
            "server",
            "--db",
            f"sqlite://{tmp}/overseer.db",
            "--listen",
            self.url[7:],
        ]
        self.proc = self._spawn()

    def _spawn(self) -> "subprocess.Popen[bytes]":
        proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.proc = proc
        self._wait_ready()
        return proc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def start_again(self) -> None:
        """The same server (port, database) started anew after `kill`."""
        self._spawn()

    def _wait_ready(self) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"overseer server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling a process we cannot be notified by
        raise RuntimeError("overseer server not ready within 30 s")

    def stop(self) -> None:
        self.kill()
        self.log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


class Recorder(httpx.AsyncBaseTransport):
    """Wraps the real transport: records every request the worker sends, and can cut the
    heartbeats of chosen leases (a network partition for that lease only)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: List[Dict[str, Any]] = []
        self.cut_heartbeats: Set[str] = set()
        self.lock = threading.Lock()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        if path.endswith("/heartbeat") and path.split("/")[3] in self.cut_heartbeats:
            raise httpx.ConnectError("partitioned by the test", request=request)
        with self.lock:
            self.sent.append(
                {"method": request.method, "path": path, "body": body, "at": time.monotonic()}
            )
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def reports_for(self, lease_id: str) -> List[Dict[str, Any]]:
        """Every complete/fail sent for `lease_id`, alone or inside a batch, written as a
        batch entry (`{"outcome", "lease_id", ...}`)."""
        out: List[Dict[str, Any]] = []
        with self.lock:
            for r in self.sent:
                p = r["path"]
                for outcome in ("complete", "fail"):
                    if p == f"/v1/leases/{lease_id}/{outcome}":
                        out.append({"outcome": outcome, "lease_id": lease_id, **(r["body"] or {})})
                if p == "/v1/leases:report":
                    out += [x for x in r["body"]["reports"] if x["lease_id"] == lease_id]
        return out

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.sent if r["path"] == path)


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Runs `worker` in a thread; stops it gracefully on exit and fails if it did not end."""
    errors: List[BaseException] = []

    def main() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as e:  # reported to the test below
            errors.append(e)

    t = threading.Thread(target=main, daemon=True)
    t.start()
    try:
        yield worker
    finally:
        worker.stop()
        t.join(30)
        assert not t.is_alive(), "the worker did not stop within 30 s"
        if errors:
            raise errors[0]


def step(job: Dict[str, Any], name: str) -> Dict[str, Any]:
    return next(s for s in job["steps"] if s["name"] == name)


def wait_until(what: str, cond: Any, timeout: float = 20.0) -> None:
    """Waits for `cond()` on a condition only observable by looking again."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def load_example(name: str) -> Dict[str, Any]:
    with open(REPO / "examples" / name) as f:
        spec: Dict[str, Any] = json.load(f)
    return spec

"""What a handler is given: the lease's data and the means to heartbeat and notice cancels."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Dict, Optional

from .wire import Lease


class Context:
    """One attempt of one step, as its handler sees it.

    `deadline` is on the `time.monotonic()` clock: the handler's result is dropped (nothing is
    reported) if it comes later. `cancelled` turns true when the attempt is cancelled (the job
    is being cancelled, the lease was lost, or the deadline passed): an `async def` handler is
    also cancelled outright; a plain `def` handler should check it (or wait on
    `cancel_event`) and return early."""

    def __init__(self, lease: Lease, deadline: float) -> None:
        self.lease_id: str = lease["lease_id"]
        self.job_id: str = lease["job_id"]
        self.step: str = lease["step"]
        self.agent: str = lease["agent"]
        self.attempt: int = int(lease["attempt"])
        self.payload: Any = lease.get("payload")
        self.inputs: Dict[str, Any] = dict(lease.get("inputs") or {})
        self.idempotency_key: str = lease["idempotency_key"]
        self.kind: str = lease.get("kind", "work")
        self.deadline = deadline
        self.cancel_event = threading.Event()
        self._beat: Optional[Callable[[Any], None]] = None
        self._set_progress: Optional[Callable[[Any], None]] = None

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def time_left(self) -> float:
        """Seconds until the local deadline."""
        return self.deadline - time.monotonic()

    def heartbeat(self, progress: Any = None) -> None:
        """Asks for a heartbeat now, carrying `progress` (any JSON). Returns at once; safe
        from any thread. The worker heartbeats on its own anyway."""
        if self._beat is not None:
            self._beat(progress)

    def progress(self, value: Any) -> None:
        """Reports how the work is going (any JSON, at most the server's
        `limits.progress_bytes`, 4 KiB by default, encoded) with the next regular heartbeat,
        without asking for one now: a newer value set before then replaces it. The server keeps
        the last one on the step (`progress` in `Client.get`), and records it in the job's
        history only for a step submitted with `progress_events: true`. Safe from any thread."""
        if self._set_progress is not None:
            self._set_progress(value)

    def _cancel(self) -> None:
        self.cancel_event.set()


def monotonic_of(loop: asyncio.AbstractEventLoop, loop_time: float) -> float:
    """A loop-clock instant on `time.monotonic()` (they are the same clock by default)."""
    return time.monotonic() + (loop_time - loop.time())

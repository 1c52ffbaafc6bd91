"""A worker process for the tests that kill or signal one: `python worker_proc.py URL MODE`.

It prints `started <lease_id>` when its handler starts, then:
- `hang`: blocks until killed;
- `slow`: works for 1 s (a graceful stop must let it finish and report)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from overseer import Context, Worker


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    # The worker's log on stdout: the tests wait for its "stopping" line between signals.
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    worker = Worker(url, worker_id=f"proc-{mode}", concurrency=1, poll_wait=1.0)

    @worker.handler("victim")
    def victim(ctx: Context) -> Any:
        print("started", ctx.lease_id, flush=True)
        if mode == "hang":
            ctx.cancel_event.wait()
        else:
            time.sleep(1.0)  # the work itself: the step takes a second
        return {"by": "proc", "attempt": ctx.attempt}

    worker.run()
    print("exited", flush=True)


if __name__ == "__main__":
    main()

"""A producer and a worker of the published Python `faktory` package over tcp+tls://.

Run by scripts/test-faktory-python-tls.sh against `overseer server --faktory-listen ...
--tls-cert ... --tls-key ...`. Environment: FAKTORY_URL (tcp+tls://host:port), FAKTORY_CA (the
PEM file that signed the server's certificate), FAKTORY_WRONG_CA (a PEM file that did not).

The package (1.0.0) wraps its socket with `ssl.wrap_socket`, which encrypts but does not check
the server's certificate, and which Python 3.12 removed. So the run has three parts:
  1. stock: the package exactly as published (Python < 3.12 only; said so otherwise), a job
     pushed and worked to completion over an encrypted, unverified connection;
  2. verified: the same producer and worker with the package's `ssl` swapped for one whose
     `wrap_socket` checks the chain against FAKTORY_CA and the host name (what a user who
     wants verification does today), a second job pushed and worked to completion;
  3. wrong CA: the verified client with FAKTORY_WRONG_CA must fail the handshake.
Prints one line per part; exits non-zero on any failure.
"""

import os
import ssl
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timedelta

import faktory
from faktory import _proto

URL = os.environ["FAKTORY_URL"]
HOST = urllib.parse.urlparse(URL).hostname
DEADLINE_S = 30


class VerifyingSsl:
    """The `ssl` module, except that `wrap_socket` verifies against one CA file."""

    def __init__(self, cafile):
        self.context = ssl.create_default_context(cafile=cafile)

    def wrap_socket(self, sock):
        return self.context.wrap_socket(sock, server_hostname=HOST)

    def __getattr__(self, name):
        return getattr(ssl, name)


def push(jid, args):
    with faktory.connection(URL) as client:
        if not client.queue("add", args=args, queue="python-tls", jid=jid):
            raise SystemExit(f"PUSH {jid} was not acknowledged")


def work_one(jid):
    """Runs a worker until the job `jid` ran and its ACK went back; returns the task's result."""
    done = {}
    worker = faktory.Worker(faktory=URL, queues=["python-tls"], use_threads=True)

    def add(x, y):
        done["result"] = x + y
        return x + y

    worker.register("add", add)
    # What Worker.run() does before its loop (run() itself never returns: it ends in sys.exit).
    worker.faktory.connect(worker_id=worker.worker_id)
    worker._last_heartbeat = datetime.now() + timedelta(seconds=worker.send_heartbeat_every)
    started = time.monotonic()
    # The package's own loop: fetch, run on a thread, send ACK; stop once nothing is pending.
    while "result" not in done or worker._pending:
        if time.monotonic() - started > DEADLINE_S:
            raise SystemExit(f"job {jid} was not worked within {DEADLINE_S}s")
        worker.tick()
    worker.faktory.disconnect()
    worker.executor.shutdown(wait=True)
    return done["result"]


def round_trip(label, jid, args):
    push(jid, args)
    result = work_one(jid)
    if result != sum(args):
        raise SystemExit(f"{label}: worker computed {result}")
    print(f"{label}: pushed and worked {jid} over TLS (result {result})")


def main():
    if hasattr(ssl, "wrap_socket"):
        round_trip("stock (encrypted, certificate not verified by the package)",
                   "py-tls-stock-0001", [1, 2])
    else:
        print(f"stock: not run, Python {sys.version.split()[0]} has no ssl.wrap_socket, "
              "which the package needs for tcp+tls://")

    _proto.ssl = VerifyingSsl(os.environ["FAKTORY_CA"])
    round_trip("verified (chain and host name checked against the CA)",
               "py-tls-verified-0001", [20, 22])

    _proto.ssl = VerifyingSsl(os.environ["FAKTORY_WRONG_CA"])
    try:
        push("py-tls-wrong-ca-0001", [0, 0])
    except ssl.SSLCertVerificationError as e:
        print(f"wrong CA: refused as it should be ({e.reason})")
    else:
        raise SystemExit("wrong CA: the handshake succeeded against a CA that did not sign")


if __name__ == "__main__":
    threading.current_thread().name = "main"
    main()

#!/usr/bin/env python3
"""Verifies an Overseer delivery (callback or alert webhook) the way a receiver should.

    verify(secret, headers, body) -> bool

`secret` is the server's `webhook_secret` (`whsec_...`), `headers` the request's headers (any
case), `body` the raw request body as bytes. Only the standard library is used. Run as a script
it reads the secret, `webhook-id`, `webhook-timestamp`, `webhook-signature` as arguments and
the body on standard input, and exits 0 if the signature is good.
"""
import base64
import hashlib
import hmac
import sys
import time

TOLERANCE_SECONDS = 5 * 60  # refuse replays of old deliveries


def verify(secret: str, headers: dict, body: bytes, now: float | None = None) -> bool:
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = h["webhook-id"], h["webhook-timestamp"], h["webhook-signature"]
    if abs((now or time.time()) - int(stamp)) > TOLERANCE_SECONDS:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{stamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    # The header may hold several space-separated `v1,<sig>` values (during a key rotation).
    return any(
        hmac.compare_digest(sig.split(",", 1)[1], expected)
        for sig in signatures.split()
        if sig.startswith("v1,")
    )


if __name__ == "__main__":
    secret, msg_id, stamp, signature = sys.argv[1:5]
    headers = {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature}
    sys.exit(0 if verify(secret, headers, sys.stdin.buffer.read()) else 1)

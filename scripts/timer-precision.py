#!/usr/bin/env python3
"""Timer precision as issue 4 states it: N jobs, each submitted with `run_at` 2 s ahead (one every
10 ms), optionally among PRELOAD jobs delayed 30 days; prints how late each step started after
its `run_at` (the server's `started_at`, i.e. when the lease was granted).

Needs a running server and an agent for agent name `t`, e.g.:
  ./target/release/overseer server --db sqlite:///tmp/tp.db --listen 127.0.0.1:7611 &
  ./target/release/overseer agent --agent t --concurrency 16 --server http://127.0.0.1:7611 -- sh -c 'cat >/dev/null' &
  python3 scripts/timer-precision.py http://127.0.0.1:7611 --preload 100000
Uses only the Python standard library.
"""
import argparse
import datetime
import json
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--preload", type=int, default=0)
    args = ap.parse_args()

    def post(path, body):
        req = urllib.request.Request(args.server + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req))

    def stamp(dt):
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def ms(text):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000

    now = datetime.datetime.now(datetime.timezone.utc)
    far = stamp(now + datetime.timedelta(days=30))
    left = args.preload
    while left > 0:
        n = min(500, left)
        post("/v1/jobs:batch", {"jobs": [{"run_at": far, "steps": [{"name": "s", "agent": "never"}]}] * n})
        left -= n
    ids = []
    for _ in range(args.jobs):
        run_at = stamp(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2))
        ids.append(post("/v1/jobs", {"run_at": run_at, "steps": [{"name": "s", "agent": "t"}]})["id"])
        time.sleep(0.01)
    time.sleep(4)
    late = []
    for job_id in ids:
        job = json.load(urllib.request.urlopen(f"{args.server}/v1/jobs/{job_id}"))
        step = job["steps"][0]
        if step["started_at"] is None:
            raise SystemExit(f"job {job_id} has not started: is an agent for `t` running?")
        late.append(ms(step["started_at"]) - ms(job["run_at"]))
    late.sort()
    print(f"jobs={len(late)} preload={args.preload} lateness_ms p50={late[len(late) // 2]:.0f} "
          f"p99={late[int(len(late) * 0.99) - 1]:.0f} max={late[-1]:.0f} min={late[0]:.0f}")


if __name__ == "__main__":
    main()

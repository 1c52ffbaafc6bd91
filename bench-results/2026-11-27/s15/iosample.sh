#!/bin/bash
# iosample.sh LABEL: every 10 s, write_bytes of the running "bench" process
while true; do p=$(pgrep -f "server --db sqlite:///tmp/overseer-bench-steady" | head -1); [ -n "$p" ] && echo "$(date +%s) $(grep write_bytes /proc/$p/io | awk '{print $2}')"; sleep 10; done

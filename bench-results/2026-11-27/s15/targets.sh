#!/bin/bash
# targets.sh BINARY: the issue's target scenarios, 3 runs each (SQLite, then PostgreSQL)
b=$1
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" sqlite drain 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" sqlite dag 3 t:$b
EXTRA="--jobs 200000" OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" sqlite submit 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" sqlite latency 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" postgres drain 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" postgres submit 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" postgres latency 3 t:$b
OUT=/tmp/s15 bash "$(dirname "$0")/../s14/ab.sh" postgres fanout 3 t:$b

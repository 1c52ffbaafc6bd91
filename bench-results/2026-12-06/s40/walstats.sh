#!/bin/bash
# walstats.sh ARM: the log records of one 40,000-job `drain` run (load and drain) on the private
# cluster on port 5433, by record type, per job (pg_waldump --stats=record).
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovw" -c "create database ovw" 2>/dev/null
$P -c "checkpoint"
a=$($P -At -c "select pg_current_wal_lsn()")
/tmp/ov-$1 bench --db postgres://postgres@127.0.0.1:5433/ovw --scenario drain 2>/dev/null | grep -E '^drain' >/dev/null
b=$($P -At -c "select pg_current_wal_lsn()")
$(pg_config --bindir)/pg_waldump -p /tmp/pg5433/data/pg_wal --stats=record -s $a -e $b 2>/dev/null \
  | awk -v arm=$1 'NR>2 && $2+0 > 0 {printf "%s %-28s %8.2f records/job\n", arm, $1, $2/40000}' | sort -k3 -nr | head -14

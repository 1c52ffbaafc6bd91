#!/bin/bash
# pgcost.sh ARM SCENARIO: one `overseer bench --scenario SCENARIO` (binary /tmp/ov-ARM) on a
# private PostgreSQL 15 cluster on port 5433 with pg_stat_statements (same settings as the
# local server: shared_buffers 128MB, fsync on), a fresh database; prints the log bytes and
# the statement execution time per job of the whole scenario (its load included).
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovw" -c "create database ovw" 2>/dev/null
$P -d ovw -c "create extension if not exists pg_stat_statements" >/dev/null
a=$($P -At -c "select pg_current_wal_lsn()")
$P -d ovw -c "select pg_stat_statements_reset()" >/dev/null
out=$(/tmp/ov-$1 bench --db postgres://postgres@127.0.0.1:5433/ovw --scenario $2 2>/dev/null | grep -E "^$2 ")
jobs=$(echo "$out" | awk '{print $2}')
b=$($P -At -c "select pg_current_wal_lsn()")
wal=$($P -At -c "select round(pg_wal_lsn_diff('$b','$a')/$jobs.0)")
ex=$($P -d ovw -At -c "select round((sum(total_exec_time)/$jobs.0*1000)::numeric, 1) from pg_stat_statements where query not like '%pg_stat%'")
echo "$1 $2 rate=$(echo "$out" | awk '{print $4}') wal_bytes_per_job=$wal exec_us_per_job=$ex"

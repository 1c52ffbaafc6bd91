#!/bin/bash
# walcount.sh ARM: WAL bytes and statement time of a 40,000-job batch submit (+ the single submits) on 5433
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovw" -c "create database ovw" 2>/dev/null
$P -d ovw -c "create extension if not exists pg_stat_statements" >/dev/null
unset OV_PRICE
a=$($P -At -c "select pg_current_wal_lsn()")
$P -d ovw -c "select pg_stat_statements_reset()" >/dev/null
/tmp/ov-$1 bench --db postgres://postgres@127.0.0.1:5433/ovw --scenario submit --jobs 40000 2>/dev/null | grep -E '^submit_batch'
b=$($P -At -c "select pg_current_wal_lsn()")
$P -At -c "select '$1 wal bytes per job', round(pg_wal_lsn_diff('$b','$a')/80000.0)"
$P -d ovw -At -c "select '$1 exec ms per job (all statements)', round((sum(total_exec_time)/80000.0)::numeric, 4) from pg_stat_statements where query not like '%pg_stat%'"

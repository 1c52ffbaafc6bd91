#!/bin/bash
# pgss.sh BIN C W: store bench on 5433 with concurrency C, W workers; per-statement calls, rows, ms
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovb" -c "create database ovb" 2>/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --scenario store --jobs 20 >/dev/null 2>&1
$P -d ovb -c "create extension if not exists pg_stat_statements" -c "truncate jobs, steps, events cascade" -c "select pg_stat_statements_reset()" >/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --scenario store --jobs 20000 --concurrency $2 --workers $3 2>&1 | grep store_drain | head -1
$P -d ovb -At -c "select calls, rows, round(total_exec_time), round((total_exec_time/calls)::numeric,3), left(regexp_replace(query,'\s+',' ','g'),60) from pg_stat_statements where query not like 'INSERT%' order by total_exec_time desc limit 14"

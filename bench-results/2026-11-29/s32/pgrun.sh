#!/usr/bin/env bash
# pgrun.sh BIN FF -> runs store bench 20000 on fresh db on 5433, with jobs fillfactor FF
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovb" -c "create database ovb" 2>/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --scenario store --jobs 50 >/dev/null 2>&1
$P -d ovb -c "truncate jobs, steps, events cascade" -c "create extension if not exists pg_stat_statements" -c "alter table jobs set (fillfactor=$2)" -c "select pg_stat_statements_reset()" -c "select pg_stat_reset()" >/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --scenario store --jobs 20000 2>&1 | grep store_
$P -d ovb -At -c "select relname, n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relname in ('jobs','steps')" 
$P -d ovb -At -c "select calls, round(total_exec_time), left(query,60) from pg_stat_statements order by total_exec_time desc limit 7"

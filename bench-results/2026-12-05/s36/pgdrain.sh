#!/bin/bash
# pgdrain.sh BIN: e2e drain of 40000 on a fresh db on 5433; statements with calls and rows
P="psql -h 127.0.0.1 -p 5433 -U postgres -q"
$P -c "drop database if exists ovb" -c "create database ovb" 2>/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --scenario drain --jobs 20 >/dev/null 2>&1
$P -d ovb -c "create extension if not exists pg_stat_statements" -c "truncate jobs, steps, events cascade" -c "select pg_stat_statements_reset()" >/dev/null
$1 bench --db postgres://postgres@127.0.0.1:5433/ovb --clients 64 --scenario drain 2>&1 | grep -E '^drain'
$P -d ovb -At -c "select calls, rows, round(total_exec_time), left(regexp_replace(query,'\s+',' ','g'),70) from pg_stat_statements order by total_exec_time desc limit 14"

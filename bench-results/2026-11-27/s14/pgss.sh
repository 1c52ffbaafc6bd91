#!/bin/bash
# pgss.sh scenario label binary: one run on the private 5433 instance, statement stats saved
sc=$1; l=$2; b=$3
psql -q -h 127.0.0.1 -p 5433 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null
psql -q -h 127.0.0.1 -p 5433 -U postgres -d overseer_bench -c "create extension pg_stat_statements" -c "select pg_stat_statements_reset()" >/dev/null
$b bench --clients 64 --scenario $sc $EXTRA --db postgres://postgres@127.0.0.1:5433/overseer_bench --output json 2>/dev/null | cut -c1-160
psql -h 127.0.0.1 -p 5433 -U postgres -d overseer_bench -c "select calls, round(total_exec_time::numeric,0) exec_ms, rows, shared_blks_hit hit, round((total_exec_time/calls)::numeric,3) per_call, left(regexp_replace(query,'\s+',' ','g'),70) q from pg_stat_statements order by total_exec_time desc limit 16" > ${OUT:-/tmp/s14}/pgss-$sc-$l.txt
psql -h 127.0.0.1 -p 5433 -U postgres -d overseer_bench -Atc "select 'TOTAL calls', sum(calls), 'exec_ms', round(sum(total_exec_time)::numeric), 'hits', sum(shared_blks_hit) from pg_stat_statements where query not like 'INSERT INTO%' or calls > 100" >> ${OUT:-/tmp/s14}/pgss-$sc-$l.txt
tail -1 ${OUT:-/tmp/s14}/pgss-$sc-$l.txt

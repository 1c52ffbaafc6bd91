#!/bin/bash
# pgss.sh ARM SCENARIO: pgcost.sh, then the top statements by total time (calls, rows, total ms,
# mean ms, shared blocks hit per call) from pg_stat_statements.
d=$(dirname "$0")
"$d/pgcost.sh" "$1" "$2"
psql -h 127.0.0.1 -p 5433 -U postgres -d ovw -At -F ' | ' -c "select calls, rows, round(total_exec_time::numeric), round((total_exec_time/calls)::numeric,3), round(shared_blks_hit::numeric/calls,1), left(regexp_replace(query, '\s+', ' ', 'g'), 100) from pg_stat_statements where query not like '%pg_stat%' order by total_exec_time desc limit 8"

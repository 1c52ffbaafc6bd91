#!/bin/bash
# fsyncs.sh BIN RETENTION LABEL: steady 2000/s for 110 s; at 85 s, 10 s of fsync/fdatasync/pwrite64 syscall timings per thread.
b=$1; r=$2; l=$3
$b bench --scenario steady --steady-rate 2000 --duration 110s --sample-every 20s --retention $r --output json > /tmp/s23/fs-$l.json 2>/dev/null &
BP=$!
sleep 85
perf record -q -e 'syscalls:sys_enter_fdatasync,syscalls:sys_exit_fdatasync,syscalls:sys_enter_fsync,syscalls:sys_exit_fsync,syscalls:sys_enter_pwrite64,syscalls:sys_exit_pwrite64' -a -o /tmp/s23/fs-$l.data -- sleep 10
wait $BP
perf script -i /tmp/s23/fs-$l.data -F comm,tid,time,event,trace 2>/dev/null > /tmp/s23/fs-$l.txt
python3 /tmp/s23/fsum.py $l
python3 /work/main/bench-results/2026-11-27/s14/steadysum.py /tmp/s23/fs-$l.json $l
rm -f /tmp/s23/fs-$l.data

#!/bin/bash
# alternating A/B: base vs new, SQLite drain and dag
for i in 1 2 3; do
  for b in base new; do
    for sc in drain dag; do
      /tmp/ov-$b bench --scenario $sc --output json 2>/dev/null | grep '^{' | grep "\"scenario\":\"$sc\"" | sed "s/^/$b $i /" >> /tmp/ab/results.txt
    done
  done
done
echo DONE >> /tmp/ab/results.txt

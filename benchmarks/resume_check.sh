#!/usr/bin/env bash
set -u
# Interrupt a sweep (SIGINT once it has 18 kernel rows, SIGKILL on the resumed run at 42), resume it
# again, and count: every config whole (12 variants), nothing measured twice. Needs a GPU.
OUT=${OUT:-/tmp}  # where the three runs write their logs
S=sqlite:////tmp/resume.sqlite; rm -f /tmp/resume.sqlite
CMD="python3 -m cutlass_tune.cli sweep configs/quick.yaml --trials 6 --jobs 8 --batch 2 --storage $S"
rows() { python3 -c "
import sys, time
from cutlass_tune.store import ResultStore
n, t0 = int(sys.argv[1]), time.time()
while time.time() - t0 < 240:
    try:
        k = [r for r in ResultStore('$S').rows(['kernel']) if r['kernel'] != 'cuBLAS']
        if len(k) >= n: print('rows', len(k)); break
    except Exception: pass
    time.sleep(0.2)
" $1; }
$CMD > $OUT/run1.log 2>&1 & pid=$!; rows 18; kill -INT $pid; wait $pid; echo "run1 (SIGINT) rc=$?"
$CMD > $OUT/run2.log 2>&1 & pid=$!; rows 42; kill -KILL $pid; wait $pid; echo "run2 (SIGKILL) rc=$?"
$CMD > $OUT/run3.log 2>&1; echo "run3 rc=$?"
python3 -c "
import collections
from cutlass_tune.store import ResultStore
rows = [r for r in ResultStore('$S').rows() if r['kernel'] != 'cuBLAS']
keys = collections.Counter((r['problem'], r['config_hash'], r['runtime']) for r in rows)
per = collections.Counter(r['config_hash'] for r in rows)
print('kernel rows', len(rows), 'distinct', len(keys), 'repeated', sum(v - 1 for v in keys.values()))
print('rows per config', sorted(per.values()), 'status', dict(collections.Counter(r['status'] for r in rows)))
print('rows per run', dict(collections.Counter(r['run_id'] for r in rows)))
"
tail -n 4 $OUT/run3.log

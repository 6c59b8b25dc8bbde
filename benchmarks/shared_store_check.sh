#!/usr/bin/env bash
set -u
# Start two sweeps at once on one new store (as two hosts sharing a PostgreSQL store would; here
# two processes on one GPU, so their timings interfere and are not results), then count: nothing
# measured twice, every config whole (12 variants). Needs a GPU.
OUT=${OUT:-/tmp}  # where the sweeps write their logs
S=sqlite:////tmp/shared.sqlite; rm -f /tmp/shared.sqlite
CMD="python3 -m cutlass_tune.cli sweep configs/quick.yaml --trials 6 --jobs 8 --batch 3 --storage $S"
for i in 1 2; do $CMD > $OUT/shared$i.log 2>&1 & done
for job in $(jobs -p); do wait $job; echo "sweep rc=$?"; done
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
for i in 1 2; do tail -n 1 $OUT/shared$i.log; done

#!/usr/bin/env bash
set -u
# Start two sweeps at once on one new store (as two hosts sharing a PostgreSQL store would; here
# two processes on one GPU, so their timings interfere and are not results), then count: nothing
# measured twice, every config whole (12 variants). Needs a GPU.
# KILL_AT=N: SIGKILL the first sweep once the store holds N kernel rows; the second takes over
# what it held, and a third run afterwards finishes what is left.
# TWO_GPUS=1: the first sweep measures on GPU 0, the second on GPU 1 (as two hosts would; then
# the timings are results). SPACE, TRIALS, BATCH: the sweeps' space and --trials, --batch.
OUT=${OUT:-/tmp}  # where the sweeps write their logs
S=sqlite:////tmp/shared.sqlite; rm -f /tmp/shared.sqlite
CMD="python3 -m cutlass_tune.cli sweep ${SPACE:-configs/quick.yaml} --trials ${TRIALS:-6} --jobs 8 --batch ${BATCH:-3} --storage $S"
GPU1=""; GPU2=""; if [ -n "${TWO_GPUS:-}" ]; then GPU1="--gpu 0"; GPU2="--gpu 1"; fi
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
$CMD $GPU1 > $OUT/shared1.log 2>&1 & first=$!
$CMD $GPU2 > $OUT/shared2.log 2>&1 & second=$!
if [ -n "${KILL_AT:-}" ]; then rows $KILL_AT; kill -KILL $first; fi
wait $first; echo "sweep 1 rc=$?"; wait $second; echo "sweep 2 rc=$?"
if [ -n "${KILL_AT:-}" ]; then $CMD > $OUT/shared3.log 2>&1; echo "sweep 3 rc=$?"; fi
python3 -c "
import collections
from cutlass_tune.store import ResultStore
rows = [r for r in ResultStore('$S').rows() if r['kernel'] != 'cuBLAS']
keys = collections.Counter((r['problem'], r['config_hash'], r['runtime']) for r in rows)
per = collections.Counter(r['config_hash'] for r in rows)
print('kernel rows', len(rows), 'distinct', len(keys), 'repeated', sum(v - 1 for v in keys.values()))
print('rows per config', sorted(per.values()), 'status', dict(collections.Counter(r['status'] for r in rows)))
print('rows per run', dict(collections.Counter(r['run_id'] for r in rows)))
print('best ratio per problem', {p: round(max(r['ratio'] for r in rows if r['problem'] == p and r['ratio']), 3)
                                 for p in sorted({r['problem'] for r in rows})})
"
for log in $OUT/shared*.log; do tail -n 3 $log; done

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
rows() { python3 benchmarks/store_rows.py wait $S $1; }
$CMD $GPU1 > $OUT/shared1.log 2>&1 & first=$!
$CMD $GPU2 > $OUT/shared2.log 2>&1 & second=$!
if [ -n "${KILL_AT:-}" ]; then rows $KILL_AT; kill -KILL $first; fi
wait $first; echo "sweep 1 rc=$?"; wait $second; echo "sweep 2 rc=$?"
if [ -n "${KILL_AT:-}" ]; then $CMD > $OUT/shared3.log 2>&1; echo "sweep 3 rc=$?"; fi
python3 benchmarks/store_rows.py count $S
for log in $OUT/shared*.log; do tail -n 3 $log; done

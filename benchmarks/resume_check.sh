#!/usr/bin/env bash
set -u
# Interrupt a sweep (SIGINT once it has 18 kernel rows, SIGKILL on the resumed run at 42), resume it
# again, and count: every config whole (12 variants), nothing measured twice. Needs a GPU.
OUT=${OUT:-/tmp}  # where the three runs write their logs
S=sqlite:////tmp/resume.sqlite; rm -f /tmp/resume.sqlite
CMD="python3 -m cutlass_tune.cli sweep configs/quick.yaml --trials 6 --jobs 8 --batch 2 --storage $S"
rows() { python3 benchmarks/store_rows.py wait $S $1; }
$CMD > $OUT/run1.log 2>&1 & pid=$!; rows 18; kill -INT $pid; wait $pid; echo "run1 (SIGINT) rc=$?"
$CMD > $OUT/run2.log 2>&1 & pid=$!; rows 42; kill -KILL $pid; wait $pid; echo "run2 (SIGKILL) rc=$?"
$CMD > $OUT/run3.log 2>&1; echo "run3 rc=$?"
python3 benchmarks/store_rows.py count $S
tail -n 4 $OUT/run3.log

#!/usr/bin/env bash
# One device call: the small-size probe (benchmarks/configs/host_load_bf16.yaml) measured on a quiet host,
# then with every core busy (one spinning process per core, as nvcc compiling a batch does),
# two paired passes each; prints the spread of every measurement and the unstable count.
# Usage on the GPU host, from the repository root: benchmarks/gpu_host_load.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
python3 -m cutlass_tune.cli compile benchmarks/configs/host_load_bf16.yaml > /dev/null 2>&1
summary() {
  python3 - "$1" <<'PY'
import statistics, sys
from cutlass_tune.measurement import read_jsonl
rows = [m for m in read_jsonl(sys.argv[1]) if not m.is_baseline]
spread = lambda med, lo, hi: (hi - lo) / med if med else 0.0
s = sorted(max(spread(m.median_ms, m.p20_ms, m.p80_ms), spread(m.baseline_median_ms, m.baseline_p20_ms, m.baseline_p80_ms))
           for m in rows if m.median_ms)
ratios = [m.paired_ratio for m in rows if m.paired_ratio]
print(f"{sys.argv[1]}: {len(rows)} kernel measurements, unstable {sum(m.status.value == 'unstable' for m in rows)}; "
      f"spread median {statistics.median(s):.2f}, max {s[-1]:.2f}; ratio min {min(ratios):.3f} max {max(ratios):.3f}")
PY
}
python3 -m cutlass_tune.cli bench benchmarks/configs/host_load_bf16.yaml --repeat 2 --output "$out/quiet.jsonl" > "$out/quiet.txt" 2>&1
summary "$out/quiet.jsonl"
for i in $(seq "$(nproc)"); do python3 -c "while True: pass" & done
python3 -m cutlass_tune.cli bench benchmarks/configs/host_load_bf16.yaml --repeat 2 --output "$out/loaded.jsonl" > "$out/loaded.txt" 2>&1
kill $(jobs -p) 2>/dev/null
summary "$out/loaded.jsonl"

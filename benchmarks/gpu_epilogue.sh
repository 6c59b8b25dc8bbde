#!/usr/bin/env bash
# Issue 25's figures: fused epilogues on LLM MLP and projection shapes, against torch eager and
# torch.compile of the same math, on one GPU in one run. Three sweeps over kernels: auto (led by
# the prior), EPILOGUE_TRIALS configs each (default 8, one batch): bf16 bias+silu, bf16 bias+gelu,
# and fp8 e4m3 -> bf16 with row x column scales (as torch._scaled_mm takes them); then each
# store's leader confirmed (top 1, EPILOGUE_PASSES passes, default 3, timed by EPILOGUE_METHOD,
# default events, the sweeps' method); then the table (benchmarks/epilogue_table.py): per shape
# and epilogue, the ratio to torch eager and to torch.compile, median over the passes with their
# range, geomeans and the goals. Shapes (EPILOGUE_SHAPES): M 1024, 4096, 8192 on LLaMA-3-8B's
# MLP, gate/up (N 14336, K 4096) and down (N 4096, K 14336).
#
# Every measurement of a fused problem's baseline times torch eager and torch.compile (default
# mode, compiled once per problem in the worker) in one sampling loop; each kernel is paired with
# eager (docs/epilogues.md). GPU time, estimated before any run: per sweep about 1.5 min of nvcc
# (8 EVT kernels on 16 cores) and 1-1.5 min of measuring, plus the first torch.compile of each
# problem; confirm about 20 s per store with events. About 10 minutes in all: two calls.
#
# It resumes across calls: each call does what is left within EPILOGUE_SECONDS (default 540); a
# sweep stopped by the time limit resumes from its store next call, a step done is marked in the
# state folder, and every call writes all it has under OUTDIR (stores, logs, table).
# Usage on the GPU host, from the repository root, as many calls as it takes:
#   benchmarks/gpu_epilogue.sh OUTDIR
# The state lives in EPILOGUE_DIR (default results/epilogue). On a fresh machine, put the files
# of the last OUTDIR's state/ back there first:
#   mkdir -p results/epilogue && tar xzf LAST_OUTDIR/epilogue-state.tgz -C results/epilogue
# The sweep needs the project's dependencies; wheels brought along in .whlmin/ (see
# benchmarks/gpu_auto_suite.sh) are installed to /tmp/site when optuna is missing.
set -uo pipefail
out=${1:?output directory}
state=${EPILOGUE_DIR:-results/epilogue}
budget=${EPILOGUE_SECONDS:-540}
trials=${EPILOGUE_TRIALS:-8}
passes=${EPILOGUE_PASSES:-3}
method=${EPILOGUE_METHOD:-events}
shapes=${EPILOGUE_SHAPES:-1024x14336x4096,4096x14336x4096,8192x14336x4096,1024x4096x14336,4096x4096x14336,8192x4096x14336}
mkdir -p "$out" "$state"
if ! python3 -c "import optuna, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whlmin/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl || exit
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$state/gpu-$gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$state/gpu-$gpu.txt"
echo "$gpu; shapes $shapes; $trials trials per epilogue; $budget s for this call"

left() { echo $((budget - SECONDS)); }

sweep() {  # NAME ARGS...: one sweep over --shapes, resumed, marked done when its budget is reached
  local name=$1 store="$state/$1-$gpu.sqlite" log="$state/$1-$gpu.sweep.txt" limit
  shift
  [ -e "$store.swept" ] && return 0
  limit=$(( $(left) - 20 ))
  if [ "$limit" -lt 150 ]; then echo "$name: no time left in this call"; return 1; fi
  echo "== $(date -u +%FT%TZ) call with $limit s" >> "$log"
  # Stop proposing at 60% of the time, so that the last batch is measured before the hard limit.
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep --shapes "$shapes" "$@" --trials "$trials" \
    --batch 8 --timeout $((limit * 6 / 10)) --storage "sqlite:///$store" >> "$log" 2>&1
  echo "$name sweep rc=$? (124: stopped by this call's time, resumes)"; tail -2 "$log"
  if tail -1 "$log" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed" \
      || tail -40 "$log" | grep -q "^compiled $trials, next batch 0,"; then
    touch "$store.swept"
  else
    return 1
  fi
}

confirm() {  # NAME: the store's leader per problem, confirmed once its sweep is done
  local name=$1 store="$state/$1-$gpu.sqlite" log="$state/$1-$gpu.confirm.txt"
  [ -e "$store.confirmed" ] && return 0
  [ -e "$store.swept" ] || return 1
  if [ "$(left)" -lt 90 ]; then echo "$name: confirm next call"; return 1; fi
  timeout -k 20 $(( $(left) - 20 )) python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" \
    --top 1 --passes "$passes" --method "$method" > "$log" 2>&1
  local rc=$?
  echo "$name confirm rc=$rc"; tail -3 "$log"
  [ $rc -eq 0 ] && touch "$store.confirmed"
}

sweep bias-silu --epilogue bias+silu \
  && sweep bias-gelu --epilogue bias+gelu \
  && sweep fp8-rowcol --dtype e4m3:bf16 --scaling rowcol \
  && confirm bias-silu && confirm bias-gelu && confirm fp8-rowcol

stores=()
for name in bias-silu bias-gelu fp8-rowcol; do
  store="$state/$name-$gpu.sqlite"
  [ -e "$store" ] || continue
  stores+=("sqlite:///$store")
  python3 -m cutlass_tune.cli best --storage "$store" > "$state/$name-$gpu.best.txt" 2>&1
done
if [ ${#stores[@]} -gt 0 ]; then
  { echo "# Fused epilogues against torch eager and torch.compile, $gpu"; echo
    cat "$state/gpu-$gpu.txt"; echo
    python3 benchmarks/epilogue_table.py "${stores[@]}"; } > "$state/epilogue-$gpu.md" 2>&1
  cat "$state/epilogue-$gpu.md"
fi
tar czf "$out/epilogue-state.tgz" -C "$state" .  # one file: a call brings back at most eight

# Sourced by the GPU scripts (`. benchmarks/gpu_env.sh || exit`, from the repository root): the
# wheels carried in .whl/ installed to /tmp/site where the GPU host lacks one of the package's
# dependencies it imports (or those named in GPU_ENV_NEEDS), this checkout first on PYTHONPATH, and
# the kernel cache in /tmp (CUTLASS_TUNE_CACHE_DIR, unless set). The lent H200 host of 2026-11-29
# lacked optuna, sqlalchemy, alembic, cutlass_library (nvidia-cutlass), platformdirs, pydantic,
# colorlog and mako: their wheels (pydantic's with pydantic-core, annotated-types and
# typing-inspection) are what .whl/ needs; SQLAlchemy's and CUTLASS's cut by benchmarks/slim_wheel.py.
needs="optuna, sqlalchemy, alembic, cutlass_library, platformdirs, typer, rich, filelock, pydantic, pynvml"
needs+="${GPU_ENV_NEEDS:+, $GPU_ENV_NEEDS}"
if ! python3 -c "import $needs" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The device tool brings back at most 8 files from $OUT, two folders down: a script whose outputs
# are more (gpu_tune_model_fp8.sh writes 11) runs into a folder outside $OUT, packed last:
# `pack_out /tmp/o "$OUT/all.tgz"`.
pack_out() { tar czf "$2" -C "$1" . ; }
# step NAME NEEDED_SECONDS COMMAND...: a resumable script's step, run once (marker $state/NAME.done),
# its output in $out/NAME.txt, skipped with a word where the caller's `left` is under NEEDED_SECONDS.
step() {
  local name=$1 need=$2; shift 2
  [ -e "$state/$name.done" ] && return 0
  if [ "$(left)" -lt "$need" ]; then echo "$name: $(left) s left, run again to go on"; return 1; fi
  timeout -k 10 $(( $(left) - 5 )) "$@" > "$out/$name.txt" 2>&1 && touch "$state/$name.done"
  local rc=$?; echo "$name rc=$rc at ${SECONDS}s"; tail -12 "$out/$name.txt" | cut -c1-220
  return $rc
}
# A second transformers (a wheel cut by benchmarks/slim_wheel.py, and any newer dependency it
# needs, in .whl/transformers-new/): installed to its own folder, used by `tf_new COMMAND...` only.
tf_new() { echo "no transformers in .whl/transformers-new/" >&2; return 2; }
if compgen -G ".whl/transformers-new/*.whl" >/dev/null &&
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tf-new \
     .whl/transformers-new/*.whl; then
  tf_new() { PYTHONPATH=/tmp/tf-new:$PYTHONPATH "$@"; }
fi
# model_runs TABLE DIR NAME [PREFIX...]: each MODEL_RUNS entry ("FAMILY TOKENS FLAGS...", entries
# separated by ';') through benchmarks/moe_model.py on TABLE into DIR/NAME (a command such as tf_new
# prefixed), its log DIR/NAME-FAMILY.txt; stops where fewer than 100 s are left of the caller's `left`.
model_runs() {
  local table=$1 dir=$2 name=$3 run family tokens flags runs; shift 3
  IFS=';' read -ra runs <<< "${MODEL_RUNS:-}"
  mkdir -p "$dir/$name"
  for run in "${runs[@]}"; do
    read -r family tokens flags <<< "$run"
    [ "$(left)" -gt 100 ] || break
    "$@" timeout -k 10 $(( $(left) - 60 )) python3 benchmarks/moe_model.py "$table" "$dir/$name" \
      --family "$family" --tokens "$tokens" --profile --blocks 6 $flags >> "$dir/$name-$family.txt" 2>&1
    echo "$name $run rc=$? at ${SECONDS}s"
  done
}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
# Kernels compiled on the CPU host (benchmarks/kernel_cache_pack.sh: the same nvcc and CUTLASS, so the
# same cache keys) travel as .whl/kcache.tar.xz and join the cache: the GPU host then compiles none of
# them (a bare host spent 300 of a 560 s call on nvcc for the committed stores' cuts).
if [ -e .whl/kcache.tar.xz ] && [ ! -e "$CUTLASS_TUNE_CACHE_DIR/.kcache-unpacked" ]; then
  mkdir -p "$CUTLASS_TUNE_CACHE_DIR" && tar xJf .whl/kcache.tar.xz -C "$CUTLASS_TUNE_CACHE_DIR" &&
    touch "$CUTLASS_TUNE_CACHE_DIR/.kcache-unpacked"
fi
# gpu_facts FILE: the GPU, torch (and transformers where installed) and the checkout's commit,
# written to FILE and printed.
gpu_facts() {
  { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c "import importlib.util, torch; t = importlib.util.find_spec('transformers') and __import__('transformers'); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, *(('transformers', t.__version__) if t else ()))"
    # COMMIT names the tree where the copy on the GPU host carries a stale .git (its files are newer)
    if [ -n "${COMMIT:-}" ]; then echo "commit $COMMIT"; else git log -1 --format='%h %s' 2>/dev/null; fi; } > "$1"
  cat "$1"
}
# export_cut DIR NAME GZ PATTERN [EXPORT OPTIONS]: a committed store (GZ) unpacked to DIR/NAME.sqlite,
# its best rows whose problem matches PATTERN (a regular expression) kept in DIR/NAME-rows.csv and
# exported to DIR/NAME-bundle. CUT_EXTRA: more stores (.sqlite or .sqlite.gz, space-separated) whose
# best rows join the cut whole (the problems swept this call, e.g. by gpu_moe_wgrad.sh). The
# dispatcher decides on no row measured by a sweep's single launches alone, so a store swept and
# never confirmed is confirmed first: CUT_CONFIRM, `confirm` options for the cut's store (e.g.
# "--problem P ..."), CUT_CONFIRM_EXTRA=1 for each extra store whole. One confirm at a time on the
# GPU (a lock: the cuts run side by side); a failed confirm is said and its rows stay unconfirmed.
# The committed stores' cuts that gpu_native_moe.sh exports and kernel_cache_pack.sh compiles ahead:
# each a store and the pattern of its problems; the MoE cut's extra stores (its tt and weight-gradient rows).
CUT_MOE_STORE=benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz
CUT_MOE_PATTERN='x3072x4096_|x4096x1536_|x2816x2048_|x2048x1408_|x5760x2880_|x2880x2880_'  # Qwen3-235B, DeepSeek-V2-Lite, GPT-OSS
CUT_MOE_EXTRA="benchmarks/results/moe_train_h200_20261129d/1_wgrad_tt_sweeps/tt.sqlite.gz benchmarks/results/moe_train_h200_20261129d/1_wgrad_tt_sweeps/wgrad.sqlite.gz"
CUT_DENSE_STORE=benchmarks/results/fusion_e2e_h200_20261127/fusion-e2e.sqlite.gz
CUT_DENSE_PATTERN='^8192x1024x1024_bf16bf16bf16_tn(?:_bias)?$|^8192x4096x1024_bf16bf16bf16_tn_bias\+gelu$'
CUT_FP8_STORE=benchmarks/results/fp8_h200_20261127/rowwise/fp8_suite-nvidia-h200.sqlite.gz
CUT_FP8_PATTERN='^(16|32|64)x'
cut_rows() {  # TABLE.csv OUT.csv PATTERN: the table's rows whose problem matches PATTERN (a regular expression)
  python3 -c "import sys, pandas as pd; t = pd.read_csv(sys.argv[1]); t[t.problem.str.contains(sys.argv[3])].to_csv(sys.argv[2], index=False)" \
    "$1" "$2" "$3"
}
cut_confirm() {  # STORE [CONFIRM OPTIONS]
  local store=$1; shift
  flock /tmp/cutlass-tune-gpu.lock python3 -m cutlass_tune.cli confirm --storage "$store" --top 1 --passes 2 "$@" \
    > "$store.confirm.txt" 2>&1 || echo "export_cut: confirm of $store failed: $(tail -1 "$store.confirm.txt")"
}
export_cut() {
  local dir=$1 name=$2 gz=$3 pattern=$4 extra i=0; shift 4
  gunzip -c "$gz" > "$dir/$name.sqlite" || return
  [ -z "${CUT_CONFIRM:-}" ] || cut_confirm "$dir/$name.sqlite" $CUT_CONFIRM
  python3 -m cutlass_tune.cli best --storage "$dir/$name.sqlite" --format csv -o "$dir/$name-best.csv" > /dev/null &&
  cut_rows "$dir/$name-best.csv" "$dir/$name-rows.csv" "$pattern" || return
  for extra in ${CUT_EXTRA:-}; do
    [ -e "$extra" ] || { echo "export_cut: $extra is missing: left out"; continue; }
    i=$((i + 1))
    case $extra in *.gz) gunzip -c "$extra" > "$dir/$name-extra$i.sqlite";; *) cp "$extra" "$dir/$name-extra$i.sqlite";; esac
    [ "${CUT_CONFIRM_EXTRA:-0}" != 1 ] || cut_confirm "$dir/$name-extra$i.sqlite"
    python3 -m cutlass_tune.cli best --storage "$dir/$name-extra$i.sqlite" --format csv -o "$dir/$name-extra$i.csv" > /dev/null &&
    python3 -c "import sys, pandas as pd; pd.concat([pd.read_csv(sys.argv[1]), pd.read_csv(sys.argv[2])]).to_csv(sys.argv[1], index=False)" \
      "$dir/$name-rows.csv" "$dir/$name-extra$i.csv" || return
  done
  python3 -m cutlass_tune.cli export --storage "$dir/$name-rows.csv" -o "$dir/$name-bundle" "$@"
}

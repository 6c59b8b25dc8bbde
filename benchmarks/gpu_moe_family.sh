#!/usr/bin/env bash
# One MoE family from nothing on one GPU (benchmarks/moe_layer.md): its expert GEMMs swept as the
# README's MoE commands do (`sweep --shapes`), confirmed in the sustained regime, exported (the
# native library built with the bundle), then the experts layer and the 4-layer model at 4096
# tokens, compiled, each against transformers' "grouped_mm" experts with a profile.
#
#   FAMILY=gpt_oss SHAPES=e32:16384x5760x2880,e32:16384x2880x2880 LAYOUT=tt \
#     benchmarks/gpu_moe_family.sh OUTDIR
#
# FAMILY: a family of benchmarks/moe_model.py; SHAPES: its grouped problems (eE:ROWSxNxK, ROWS the
# routed rows: tokens x top_k); LAYOUT: tn (weights E x out x in) or tt (E x in x out, GPT-OSS's);
# TRIALS (default 12) configs compiled per problem; TOKENS (default 4096); MODEL_FLAGS more
# moe_model.py flags; DECODE_TOKENS (e.g. "1 64 256": the layer in CUDA graphs at those sizes) and RUNS
# (more model runs, "TOKENS FLAGS..." separated by ';'); BUDGET seconds (default 540): a step that
# does not fit is skipped, said.
# State in FAMILY_DIR (default /tmp/moe-family): a rerun on the same machine skips what is done.
# The device hands a machine back when idle, and the state with it: every call leaves the state
# (store, bundle, step markers) in OUTDIR/state.tgz and its logs, tables and profiles in
# OUTDIR/results.tgz; RESUME=PATH (the state.tgz, carried) starts the next call from it.
set -uo pipefail
final=${1:?output directory}
family=${FAMILY:?FAMILY}; shapes=${SHAPES:?SHAPES}; layout=${LAYOUT:-tn}
trials=${TRIALS:-12}; tokens=${TOKENS:-4096}; budget=${BUDGET:-540}
state=${FAMILY_DIR:-/tmp/moe-family}
# the device hands back 8 files at most: the logs, tables and profiles travel as one archive
out=$state-results
mkdir -p "$final" "$out" "$state"
if [ -n "${RESUME:-}" ] && [ ! -e "$state/$family.sqlite" ]; then tar xzf "$RESUME" -C "$state" || exit; fi
trap 'tar czf "$final/state.tgz" -C "$state" .; tar czf "$final/results.tgz" -C "$out" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct=(python3 -m cutlass_tune.cli)
gpu_facts "$out/gpu.txt"
store=$state/$family.sqlite

step sweep 200 "${ct[@]}" sweep --shapes "$shapes" --layout "$layout" --dtype bf16 --routing uniform \
  --trials "$trials" --storage "$store" || exit
step confirm 60 "${ct[@]}" confirm --storage "$store" --top 2 --passes 2 --regime sustained || exit
[ -e "$state/export.done" ] || rm -rf "$state/bundle"
step export 120 "${ct[@]}" export --storage "$store" -o "$state/bundle" || exit
"${ct[@]}" best --storage "$store" --format csv -o "$out/$family-best.csv" > /dev/null
gzip -c "$store" > "$out/$family.sqlite.gz"
step layer 90 python3 benchmarks/moe_layer.py "$state/bundle" "$out/layer" --family "$family" --tokens "$tokens" \
  --mode compiled --profile
step model 150 python3 benchmarks/moe_model.py "$state/bundle" "$out/model" --family "$family" --tokens "$tokens" \
  --compile --profile --blocks 6 ${MODEL_FLAGS:-}
if [ -n "${DECODE_TOKENS:-}" ]; then  # the layer at decode sizes in CUDA graphs (against "batched_mm" too)
  step layer-decode 60 python3 benchmarks/moe_layer.py "$state/bundle" "$out/layer" --family "$family" \
    --tokens $DECODE_TOKENS --mode graphs --profile
fi
# more model runs on the bundle ("TOKENS FLAGS..." entries separated by ';', e.g. "1 --compile --graphs
# --decode;16384 --compile;4096 --train"), each once (a marker per entry), while the budget lasts
IFS=';' read -ra runs <<< "${RUNS:-}"
for i in "${!runs[@]}"; do
  read -r run_tokens run_flags <<< "${runs[$i]}"
  step "run$i" 100 python3 benchmarks/moe_model.py "$state/bundle" "$out/model" --family "$family" \
    --tokens "$run_tokens" --profile $run_flags
done
python3 benchmarks/moe_model.py summary "$out/model" 2>/dev/null | tail -12
echo "done at ${SECONDS}s"

#!/usr/bin/env bash
# Issue 22's figures: LLM projection shapes nobody tuned (configs/auto_bf16.yaml: nine shapes of
# Qwen2.5, Gemma-2, Phi-3 and Falcon, M 128-16384) swept over kernels: auto (`sweep --shapes`,
# led by the prior) and over the lists of configs/sm90_bf16.yaml (`sweep sm90_bf16.yaml --shapes`,
# Optuna after the warm start), the same budget each (--trials 24, batches of 8), then each
# store's leaders confirmed (`confirm`: top 2, 2 passes, sustained timing), then the two side by
# side. Both sweeps race the run-time variants (the default); benchmarks/race_ab.py measures what
# racing saves on six of the auto sweep's kernels (benchmarks/racing.md). The auto sweep runs first; they alternate nothing, so compare ratios, not TFLOP/s.
#
# It resumes across calls: each call does what is left, within AUTO_SUITE_SECONDS (default 540),
# a sweep stopped by the time limit resumes from its store next call (kill-safe), a step done is
# marked in the state folder, and every call writes all it has under OUTDIR (stores, logs, tables).
# Usage on the GPU host, from the repository root, as many calls as it takes (about 5-8):
#   benchmarks/gpu_auto_suite.sh OUTDIR
# The state (stores, markers, logs) lives in AUTO_SUITE_DIR (default results/auto-suite). On a
# fresh machine, put the files of the last OUTDIR's state/ back there first:
#   mkdir -p results/auto-suite && tar xzf LAST_OUTDIR/state.tgz -C results/auto-suite
# The sweep needs the project's dependencies (scikit-learn among them). On a host whose Python
# has torch but not the rest, install wheels brought along (.whlmin/: alembic, annotated-types,
# colorlog, greenlet, mako, nvidia-cutlass, nvidia-matmul-heuristics, optuna, platformdirs,
# pydantic, pydantic-core, sqlalchemy, typing-extensions, typing-inspection) first:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whlmin/*.whl && export PYTHONPATH=/tmp/site
set -uo pipefail
out=${1:?output directory}
state=${AUTO_SUITE_DIR:-results/auto-suite}
budget=${AUTO_SUITE_SECONDS:-540}
trials=${AUTO_SUITE_TRIALS:-24}
mkdir -p "$out" "$state"
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # benchmarks/*.py import the package from here
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
shapes=$(python3 -c "from cutlass_tune.space import load_space
print(','.join(f'{p.m}x{p.n}x{p.k}' for p in load_space('configs/auto_bf16.yaml').problems))") || exit
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$state/gpu-$gpu.txt"
echo "$gpu; shapes $shapes; $trials trials each; $budget s for this call"

left() { echo $((budget - SECONDS)); }

sweep() {  # NAME [SPACE FILE]: one sweep, resumed, marked done when its budget is reached
  local name=$1 store="$state/$1-$gpu.sqlite" log="$state/$1-$gpu.sweep.txt" limit
  shift
  [ -e "$store.swept" ] && return 0
  limit=$(( $(left) - 20 ))
  if [ "$limit" -lt 120 ]; then echo "$name: no time left in this call"; return 1; fi
  echo "== $(date -u +%FT%TZ) call with $limit s" >> "$log"
  # Stop proposing at 60% of the time, so that the last batch is measured before the hard limit.
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep "$@" --shapes "$shapes" --trials "$trials" \
    --batch 8 --timeout $((limit * 6 / 10)) --storage "sqlite:///$store" >> "$log" 2>&1
  echo "$name sweep rc=$? (124: stopped by this call's time, resumes)"; tail -2 "$log"
  # Done: its budget compiled (a timeout met in the same batch says "timeout"), or nothing left.
  if tail -1 "$log" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed" \
      || tail -40 "$log" | grep -q "^compiled $trials, next batch 0,"; then
    touch "$store.swept"
  else
    return 1
  fi
}

confirm() {  # NAME: the store's leaders, confirmed once the sweep is done
  local name=$1 store="$state/$1-$gpu.sqlite" log="$state/$1-$gpu.confirm.txt"
  [ -e "$store.confirmed" ] && return 0
  [ -e "$store.swept" ] || return 1
  if [ "$(left)" -lt 200 ]; then echo "$name: confirm needs about 3 minutes; next call"; return 1; fi
  timeout -k 20 $(( $(left) - 20 )) python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" \
    ${AUTO_SUITE_CONFIRM:---top 2 --passes 2} > "$log" 2>&1
  local rc=$?
  echo "$name confirm rc=$rc"; tail -3 "$log"
  [ $rc -eq 0 ] && touch "$store.confirmed"
}

race_ab() {  # GPU seconds per kernel-problem with and without racing, on kernels of the auto sweep
  local json="$state/race-ab-$gpu.json"
  [ -e "$json" ] && return 0
  [ -e "$state/auto-$gpu.sqlite.swept" ] || return 1
  if [ "$(left)" -lt 240 ]; then echo "race A/B needs about 4 minutes; next call"; return 1; fi
  timeout -k 20 $(( $(left) - 20 )) python3 benchmarks/race_ab.py "$state/auto-$gpu.sqlite" "$json" \
    "${RACE_AB_KERNELS:-6}" > "$state/race-ab-$gpu.txt" 2>&1
  echo "race A/B rc=$?"; tail -12 "$state/race-ab-$gpu.txt"
}

sweep auto && sweep lists configs/sm90_bf16.yaml && race_ab && confirm auto && confirm lists

for name in auto lists; do
  store="$state/$name-$gpu.sqlite"
  [ -e "$store" ] || continue
  python3 benchmarks/sweep_report.py "sqlite:///$store" > "$state/$name-$gpu.report.md" 2>&1
  python3 -m cutlass_tune.cli best --storage "$store" > "$state/$name-$gpu.best.txt" 2>&1
done
python3 - "$state" "$gpu" "$shapes" > "$state/auto-vs-lists-$gpu.md" 2>&1 <<'EOF'
"""The best of each problem by each space, side by side (confirmed where confirm has run)."""
import json
import math
import sys
from pathlib import Path

from cutlass_tune.report import load_best
from cutlass_tune.space import KernelConfig, space_for_shapes

state, gpu, shapes = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lists = space_for_shapes(shapes, config="configs/sm90_bf16.yaml")
best = {}
for name in ("auto", "lists"):
    store = state / f"{name}-{gpu}.sqlite"
    if store.exists():
        best[name] = {r["problem"]: r for r in load_best(str(store)).to_dict("records")}
print(f"# kernels: auto (prior) beside configs/sm90_bf16.yaml (optuna), {gpu}\n")
print("| problem | auto: ratio | passes | auto's kernel | in sm90_bf16 | lists: ratio | passes | lists' kernel "
      "| auto / lists |")
print("|---|---|---|---|---|---|---|---|---|")
logs = []
for p in lists.problems:
    a, b = (best.get(n, {}).get(p.name) for n in ("auto", "lists"))
    cells = [p.name]
    for r, with_space in ((a, True), (b, False)):
        if r is None:
            cells += ["-", "-", "-"] + (["-"] if with_space else [])
            continue
        cells += [f"{r['ratio']:.3f}", str(r["confirm_passes"] or "sweep"), r["kernel"]]
        if with_space:
            cells.append("yes" if lists.holds(KernelConfig.from_dict(json.loads(r["config"]))) else "no")
    if a is not None and b is not None:
        logs.append(math.log(a["ratio"] / b["ratio"]))
        cells.append(f"{a['ratio'] / b['ratio']:.3f}")
    else:
        cells.append("-")
    print("| " + " | ".join(cells) + " |")
if logs:
    print(f"\ngeomean auto / lists over {len(logs)} problems: {math.exp(sum(logs) / len(logs)):.3f}; "
          f"auto ahead by more than 1% on {sum(x > math.log(1.01) for x in logs)}, behind by more than 1% on "
          f"{sum(x < -math.log(1.01) for x in logs)}")
EOF
cat "$state/auto-vs-lists-$gpu.md"
tar czf "$out/state.tgz" -C "$state" .  # one file: a call brings back at most eight

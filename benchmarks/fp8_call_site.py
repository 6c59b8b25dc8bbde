"""fp8 row-wise GEMMs at the call site: `cutlass_tune.matmul(a, w.t(), table, scale_a=, scale_b=)`
against `torch._scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=bf16)` on the same operands
(scale_a M x 1, scale_b 1 x N), for every rowcol entry of a table, in the sustained regime
(rotating operands, settled clocks): back to back in CUDA graphs and called from Python.

Each entry's result is checked against the fp32 reference first. One JSON line per entry goes to
OUTDIR/fp8_call_site.jsonl as it is known (a rerun skips the entries already there, so a call cut
off resumes); the table printed last gives the ratio (torch's time over ours) per shape and mode,
the geomean and the goal (geomean >= 1.00, none below 0.97).

    python3 benchmarks/fp8_call_site.py TABLE_OR_STORE OUTDIR [--budget-ms 1500]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import cutlass_tune
from cutlass_tune.bench import ClockMonitor, TimingOptions, compare
from cutlass_tune.bench._check import problem_of_row
from cutlass_tune.bench._timing import rotation_count, time_sustained
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.space import Scaling

GOAL_GEOMEAN, GOAL_FLOOR = 1.00, 0.97


def _entries(table: cutlass_tune.BestTable) -> list[dict]:
    return [r for r in table.frame.to_dict("records") if str(r.get("scaling", "none")) == Scaling.ROWCOL.value]


def main(source: str, outdir: Path, budget_ms: float) -> None:
    table = cutlass_tune.BestTable.load(source)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "fp8_call_site.jsonl"
    done = {json.loads(line)["problem"]: json.loads(line) for line in path.read_text().splitlines()} \
        if path.exists() else {}
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    options = TimingOptions(budget_ms=budget_ms, min_samples=5, method=TimingMethod.SUSTAINED, paired=True)
    monitor = ClockMonitor(device)
    generator = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    print(f"{props.name}; torch {torch.__version__}; sustained, rotating operands", flush=True)
    for row in _entries(table):
        problem = problem_of_row(row)
        if problem.name in done:
            continue
        first = allocate(problem, f"cuda:{device}")
        randomize(first, generator)
        record: dict = {"problem": problem.name, "m": problem.m, "n": problem.n, "k": problem.k,
                        "kernel": str(row["kernel"]), "claimed": row.get("ratio")}
        try:
            got = cutlass_tune.matmul(first.a_mk, first.b_kn, table=table, scale_a=first.scale_a,
                                      scale_b=first.scale_b)
            verdict = compare(got, reference(first), problem.dtype_d, fp8_inputs=True)
            record["rel_error"] = verdict.rel_error
            if verdict.reason:
                record["error"] = f"matmul's result: {verdict.reason}"
            free, _ = torch.cuda.mem_get_info(device)
            copies = [first] + [first.copy() for _ in range(
                rotation_count(first.nbytes, props.L2_cache_size, memory_bytes=free) - 1)]
            ours = [(lambda o=o: cutlass_tune.matmul(o.a_mk, o.b_kn, table=table, scale_a=o.scale_a,
                                                     scale_b=o.scale_b)) for o in copies]
            theirs = [(lambda o=o: torch._scaled_mm(o.a_mk, o.b_kn, scale_a=o.scale_a, scale_b=o.scale_b,
                                                    out_dtype=torch.bfloat16)) for o in copies]
            for mode in ("graph", "loop"):
                tuned, torch_side = time_sustained([ours, theirs], options=options, probe=monitor.reading,
                                                   capture=mode == "graph")
                record[mode] = {"ours_ms": tuned.median_ms, "torch_ms": torch_side.median_ms,
                                "ratio": torch_side.median_ms / tuned.median_ms}
        except (RuntimeError, ValueError, CutlassTuneError) as err:
            record["error"] = f"{type(err).__name__}: {err}"[:300]
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        done[problem.name] = record
        print(json.dumps(record), flush=True)
    _print_table(list(done.values()))


def _print_table(records: list[dict]) -> None:
    print("\n| shape (MxNxK) | graph ratio | loop ratio | claimed | rel. error | kernel |\n|---|---|---|---|---|---|")
    ratios = []
    for r in sorted(records, key=lambda r: (r["m"], r["n"], r["k"])):
        graph, loop = r.get("graph", {}).get("ratio"), r.get("loop", {}).get("ratio")
        if graph:
            ratios.append(graph)
        cells = [f"{x:.3f}" if isinstance(x, float) else "-" for x in (graph, loop, r.get("claimed"))]
        err = f"{r['rel_error']:.1e}" if r.get("rel_error") is not None else r.get("error", "-")
        print(f"| {r['m']}x{r['n']}x{r['k']} | {' | '.join(cells)} | {err} | {r['kernel']} |")
    if ratios:
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        met = geomean >= GOAL_GEOMEAN and min(ratios) >= GOAL_FLOOR
        print(f"\ngraph: geomean {geomean:.3f} over {len(ratios)} shapes, lowest {min(ratios):.3f}; goal (geomean >= "
              f"{GOAL_GEOMEAN:.2f}, none below {GOAL_FLOOR:.2f}): {'met' if met else 'missed'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a store URL or file, or a best-config table or bundle")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--budget-ms", type=float, default=1500.0, help="GPU time per entry and mode")
    cli = parser.parse_args()
    main(cli.source, cli.outdir, cli.budget_ms)

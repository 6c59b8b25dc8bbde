"""fp8 GEMMs at the call site: `cutlass_tune.matmul(a, w.t(), table, scale_a=, scale_b=)` against
torch's path for the same math on the same operands, for every row-wise (rowcol) and block-wise
entry of a table, in the sustained regime (rotating operands, settled clocks): back to back in
CUDA graphs and called from Python.

torch's path: row-wise, `torch._scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=bf16)` (scale_a
M x 1, scale_b 1 x N), timed twice, with its default (promoting) accumulation and with
`use_fast_accum=True`, the counterpart of the FP8FastAccum kernels the tables pick: the ratio is
to the faster of the two (the strongest path torch has for the same math), and the JSON line keeps
both; block-wise (scale_a M x K/128, scale_b K/128 x N/128), the same call
where this torch's `_scaled_mm` takes block-wise scales, else `blockwise_dequantized_mm` (both
operands dequantized to bf16, then torch.matmul). Each JSON line names its path ("baseline").

Each entry's result is checked against the fp32 reference first. One JSON line per entry goes to
OUTDIR/fp8_call_site.jsonl as it is known (a rerun skips the entries already there, by problem
name, which holds the scaling, so a call cut off resumes); the table printed last has a section
per scaling with the ratio (torch's time over ours) per shape and mode, the geomeans and the
goals: row-wise geomean >= 1.00 and none below 0.97; block-wise geomean >= 1.20 at M <= 256 and
>= 1.00 above.

`matmul` runs with `--min-ratio` (default 1.0, its own default): an entry whose kernel the table
measured slower than torch runs torch's path (with fast accumulation where the kernel has it), as
a caller's would; the table names those "torch kept".

    python3 benchmarks/fp8_call_site.py TABLE_OR_STORE OUTDIR [--budget-ms 1500] [--min-ratio 1.0] [--trace]

`--trace`: per entry, where a call's time goes from Python: 40 calls of each side (the operand
copies in turn, as the loop calls them) under torch.profiler, the operators and runtime calls of
most host time and every kernel with its count, to OUTDIR/trace-<problem>.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import cutlass_tune
from cutlass_tune._torch import blockwise_dequantized_mm, blockwise_scaled_mm_for
from cutlass_tune.bench import ClockMonitor, TimingOptions, compare
from cutlass_tune.bench._check import problem_of_row
from cutlass_tune.bench._timing import rotation_count, time_sustained
from cutlass_tune.bench._verify import Operands, allocate, randomize, reference
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.space import Scaling

SCALINGS = (Scaling.ROWCOL, Scaling.BLOCKWISE)
"""The scalings checked, in the table's order."""
SMALL_M = 256
"""Block-wise GEMMs up to this M (decode and small batches) have their own, higher goal."""


@dataclasses.dataclass(frozen=True)
class Goal:
    """What the graph-mode ratios (torch's time over ours) of one scaling's entries with M from
    `min_m` to `max_m` must reach: their geomean, and each one the floor."""

    scaling: Scaling
    band: str
    """The entries it covers, in words."""
    min_m: int
    max_m: float
    geomean: float
    floor: float = 0.0

    def covers(self, record: dict) -> bool:
        return record["scaling"] == self.scaling.value and self.min_m <= record["m"] <= self.max_m

    def verdict(self, records: Sequence[dict]) -> str | None:
        """One line on the covered entries that have a graph ratio: their geomean, lowest and
        whether the goal is met; None when none has."""
        ratios = [r["graph"]["ratio"] for r in records if self.covers(r) and r.get("graph", {}).get("ratio")]
        if not ratios:
            return None
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        met = geomean >= self.geomean and min(ratios) >= self.floor
        wanted = f"geomean >= {self.geomean:.2f}" + (f", none below {self.floor:.2f}" if self.floor else "")
        return (f"graph, {self.band}: geomean {geomean:.3f} over {len(ratios)} shapes, lowest {min(ratios):.3f}; "
                f"goal ({wanted}): {'met' if met else 'missed'}")


GOALS = (
    Goal(Scaling.ROWCOL, "every M", 1, math.inf, geomean=1.00, floor=0.97),
    Goal(Scaling.BLOCKWISE, f"M <= {SMALL_M}", 1, SMALL_M, geomean=1.20),
    Goal(Scaling.BLOCKWISE, f"M > {SMALL_M}", SMALL_M + 1, math.inf, geomean=1.00),
)

TorchCall = Callable[[Operands], torch.Tensor]


def fast_accum_path(o: Operands) -> torch.Tensor:
    """Row-wise torch._scaled_mm with fast accumulation (no promotion of the partial sums)."""
    return torch._scaled_mm(o.a_mk, o.b_kn, *_scales(o), out_dtype=torch.bfloat16, use_fast_accum=True)


def torch_path(scaling: Scaling, device: torch.device, k: int) -> tuple[str, TorchCall]:
    """torch's call for the same math as a `scaling` entry of inner size `k` on `device`, and its
    name (block-wise: `_scaled_mm` where it computes that K right, `blockwise_scaled_mm_for`)."""
    def scaled_mm(o: Operands) -> torch.Tensor:
        return torch._scaled_mm(o.a_mk, o.b_kn, *_scales(o), out_dtype=torch.bfloat16)

    def dequantized(o: Operands) -> torch.Tensor:
        return blockwise_dequantized_mm(o.a_mk, o.b_kn, *_scales(o), torch.bfloat16)

    if scaling is Scaling.ROWCOL:
        return "torch._scaled_mm rowwise", scaled_mm
    if blockwise_scaled_mm_for(device, k):
        return "torch._scaled_mm blockwise", scaled_mm
    return "blockwise_dequantized_mm", dequantized


def _scales(o: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    assert o.scale_a is not None and o.scale_b is not None, "allocate gives a scaled problem both scales"
    return o.scale_a, o.scale_b


def _entries(table: cutlass_tune.BestTable) -> list[dict]:
    checked = {s.value for s in SCALINGS}
    return [r for r in table.frame.to_dict("records") if str(r.get("scaling", "none")) in checked]


def main(source: str, outdir: Path, budget_ms: float, min_ratio: float, trace: bool = False) -> None:
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    loaded = cutlass_tune.BestTable.load(source)
    table = loaded.for_gpu(props.name)  # matmul runs only the kernels measured on this GPU model
    if not _entries(table):
        raise SystemExit(f"{source}: no fp8 entries measured on {props.name} (the table's GPUs: "
                         f"{', '.join(loaded.gpus) or 'none'})")
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "fp8_call_site.jsonl"
    done = {json.loads(line)["problem"]: json.loads(line) for line in path.read_text().splitlines()} \
        if path.exists() else {}
    options = TimingOptions(budget_ms=budget_ms, min_samples=5, method=TimingMethod.SUSTAINED, paired=True)
    monitor = ClockMonitor(device)
    generator = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    from cutlass_tune.runtime import _native

    assert callable(cutlass_tune.matmul)  # the door's import loads the library, as a user's first call does
    door = "native" if _native.door is not None else f"Python ({_native.reason() or 'no native library'})"
    print(f"{props.name}; torch {torch.__version__}; sustained, rotating operands; the door's path: {door}", flush=True)
    for row in _entries(table):
        problem = problem_of_row(row)
        if problem.name in done:
            continue
        baseline, theirs_call = torch_path(problem.scaling, torch.device("cuda", device), problem.k)
        first = allocate(problem, f"cuda:{device}")
        randomize(first, generator)
        record: dict = {"problem": problem.name, "scaling": problem.scaling.value, "m": problem.m, "n": problem.n,
                        "k": problem.k, "kernel": str(row["kernel"]), "claimed": row.get("ratio"),
                        "baseline": baseline, "min_ratio": min_ratio, "door": door}
        claimed = float(row.get("ratio", math.nan))
        if min_ratio > 0 and not claimed >= min_ratio:
            record["runs"] = "torch"  # matmul keeps torch's path: the table measured its kernel slower
        try:
            got = cutlass_tune.matmul(first.a_mk, first.b_kn, table=table, scale_a=first.scale_a,
                                      scale_b=first.scale_b, min_ratio=min_ratio)
            verdict = compare(got, reference(first), problem.dtype_d, fp8_inputs=True)
            record["rel_error"] = verdict.rel_error
            if verdict.reason:
                record["error"] = f"matmul's result: {verdict.reason}"
            free, _ = torch.cuda.mem_get_info(device)
            copies = [first] + [first.copy() for _ in range(
                rotation_count(first.nbytes, props.L2_cache_size, memory_bytes=free) - 1)]
            ours: list[Callable[[], object]] = [
                functools.partial(cutlass_tune.matmul, o.a_mk, o.b_kn, table=table, scale_a=o.scale_a,
                                  scale_b=o.scale_b, min_ratio=min_ratio) for o in copies]
            sides: list[list[Callable[[], object]]] = [ours, [functools.partial(theirs_call, o) for o in copies]]
            if problem.scaling is Scaling.ROWCOL:
                sides.append([functools.partial(fast_accum_path, o) for o in copies])
            for mode in ("graph", "loop"):
                tuned, *torch_sides = time_sustained(sides, options=options, probe=monitor.reading,
                                                     capture=mode == "graph")
                strongest = min(t.median_ms for t in torch_sides)
                record[mode] = {"ours_ms": tuned.median_ms, "torch_ms": torch_sides[0].median_ms,
                                "ratio": strongest / tuned.median_ms,
                                "ratio_default_accum": torch_sides[0].median_ms / tuned.median_ms}
                if len(torch_sides) > 1:
                    record[mode]["torch_fast_accum_ms"] = torch_sides[1].median_ms
            if trace:
                _trace(outdir / f"trace-{problem.name}.txt", {"ours": ours, "torch": sides[1]})
        except (RuntimeError, ValueError, CutlassTuneError) as err:
            record["error"] = f"{type(err).__name__}: {err}"[:300]
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        done[problem.name] = record
        print(json.dumps(record), flush=True)
    print("\n".join(table_lines(list(done.values()))))


def _trace(path: Path, sides: dict[str, Sequence[Callable[[], object]]], calls: int = 40) -> None:
    """`calls` calls of each side from Python under torch.profiler (the host's operators and
    runtime calls, the GPU's kernels), after as many unprofiled: the text to `path`."""
    from torch.profiler import ProfilerActivity, profile

    text = []
    for name, launches in sides.items():
        for i in range(calls):
            launches[i % len(launches)]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                launches[i % len(launches)]()
            torch.cuda.synchronize()
        text.append(f"== {name}: {calls} calls\n" + prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=90))
    path.write_text("\n".join(text))


def table_lines(records: Sequence[dict]) -> list[str]:
    """The printed table: per scaling with entries, its rows by shape, then each goal's verdict."""
    lines: list[str] = []
    for scaling in SCALINGS:
        section = sorted((r for r in records if r["scaling"] == scaling.value), key=lambda r: (r["m"], r["n"], r["k"]))
        if not section:
            continue
        baselines = ", ".join(dict.fromkeys(r["baseline"] for r in section))
        if scaling is Scaling.ROWCOL:
            baselines += " (the faster of its default and fast accumulation)"
        lines += [f"\n{scaling.value}, against {baselines}", "",
                  "| shape (MxNxK) | graph ratio | loop ratio | claimed | rel. error | kernel |",
                  "|---|---|---|---|---|---|"]
        for r in section:
            graph, loop = r.get("graph", {}).get("ratio"), r.get("loop", {}).get("ratio")
            cells = [f"{x:.3f}" if isinstance(x, float) else "-" for x in (graph, loop, r.get("claimed"))]
            err = f"{r['rel_error']:.1e}" if r.get("rel_error") is not None else r.get("error", "-")
            runs = r["kernel"] if r.get("runs", "kernel") == "kernel" else \
                f"torch kept (the table's {r['kernel']} below min_ratio {r['min_ratio']})"
            lines.append(f"| {r['m']}x{r['n']}x{r['k']} | {' | '.join(cells)} | {err} | {runs} |")
        verdicts = [v for goal in GOALS if goal.scaling is scaling and (v := goal.verdict(section))]
        lines += [""] + verdicts if verdicts else []
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a store URL or file, or a best-config table or bundle")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--budget-ms", type=float, default=1500.0, help="GPU time per entry and mode")
    parser.add_argument("--min-ratio", type=float, default=1.0,
                        help="matmul's min_ratio: torch's path where the table measured its kernel below it "
                             "(0: every entry's kernel runs)")
    parser.add_argument("--trace", action="store_true", help="profile 40 calls of each side per entry")
    cli = parser.parse_args()
    main(cli.source, cli.outdir, cli.budget_ms, cli.min_ratio, cli.trace)

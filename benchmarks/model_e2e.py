"""A whole model before and after `cutlass_tune.patch`, in eager mode, under torch.compile and as a
CUDA graph, timed in one run on one GPU (on the GPU host):

    python3 benchmarks/model_e2e.py TABLE --model llama_33b --layers 2 -o OUT.json

The model (benchmarks/models/llama.py) is built twice with the same random weights: the plain one
and a copy whose nn.Linear layers `patch` swapped for the tuned operator. Each mode times the two
forwards in alternating blocks of back-to-back calls (CUDA events around each block, after a
warm-up), so clocks and power drift alike for both: a model's steady stream, as
benchmarks/sustained.md defines it. Prints and writes, per mode, the median time per forward of
each side with its p20-p80 spread and their ratio (plain / patched, >1: the patched model is
faster); the patched outputs' largest difference from the plain ones, relative to the logits'
RMS; and the graph breaks torch._dynamo.explain counts in each model.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _blocks import block_ms as _block  # beside this script

import cutlass_tune


def _models(name: str, layers: int):
    spec = importlib.util.spec_from_file_location("llama_models", Path(__file__).parent / "models" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)(device="cuda", layers=layers)


def _quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=10)
    return {"median_ms": statistics.median(values), "p20_ms": q[1], "p80_ms": q[7]}


def paired(plain, patched, blocks: int, calls: int, warm_s: float = 2.0) -> dict:
    """Alternating blocks of `calls` forwards of each side, after `warm_s` seconds of both."""
    deadline = time.perf_counter() + warm_s
    while time.perf_counter() < deadline:
        _block(plain, 2)
        _block(patched, 2)
    times: dict[str, list[float]] = {"plain": [], "patched": []}
    for i in range(blocks):
        order = (("plain", plain), ("patched", patched)) if i % 2 == 0 else (("patched", patched), ("plain", plain))
        for side, call in order:
            times[side].append(_block(call, calls))
    out = {side: _quantiles(t) for side, t in times.items()}
    ratios = [a / b for a, b in zip(times["plain"], times["patched"])]
    out["ratio"] = statistics.median(times["plain"]) / statistics.median(times["patched"])
    out["ratio_p20_p80"] = [statistics.quantiles(ratios, n=10)[1], statistics.quantiles(ratios, n=10)[7]]
    return out


def graphed(model, ids):
    """`model(ids)` captured in a CUDA graph; the returned call replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(ids)
    return graph.replay, out


def _sides(mode: str, plain, patched, ids, result: dict):
    """The two calls one mode times: plain and patched."""
    if mode == "eager":
        return (lambda: plain(ids), lambda: patched(ids))
    if mode == "compile":
        for name, model in (("plain", plain), ("patched", patched)):
            explained = torch._dynamo.explain(model)(ids)
            result[f"graph_breaks_{name}"] = explained.graph_break_count
            print(f"{name}: {explained.graph_count} graphs, {explained.graph_break_count} graph breaks",
                  [str(b.reason)[:160] for b in explained.break_reasons[:3]], flush=True)
        torch._dynamo.reset()
        compiled = (torch.compile(plain), torch.compile(patched, fullgraph=result["graph_breaks_patched"] == 0))
        for c in compiled:
            c(ids)
        return (lambda: compiled[0](ids), lambda: compiled[1](ids))
    if mode == "graph":
        return (graphed(plain, ids)[0], graphed(patched, ids)[0])
    raise ValueError(f"unknown mode {mode}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bundle, table file or store the patch reads")
    parser.add_argument("--model", default="llama_33b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--modes", default="eager,compile,graph")
    parser.add_argument("--min-ratio", type=float, default=None, help="patch's min_ratio (default: its own)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # torch's default
    plain, (ids,) = _models(args.model, args.layers)
    patched = copy.deepcopy(plain)
    kwargs = {} if args.min_ratio is None else {"min_ratio": args.min_ratio}
    report = cutlass_tune.patch(patched, args.table, **kwargs)
    print(report, flush=True)
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
                    "layers": args.layers, "tokens": ids.numel(), "table": str(args.table),
                    "swapped": [d.name for d in report.swapped],
                    "left": {d.name: d.reason for d in report.left}, "modes": {}}

    with torch.inference_mode():
        want = plain(ids).logits.float()
        got = patched(ids).logits.float()
        rms = want.pow(2).mean().sqrt().item()
        result["max_abs_diff_over_rms"] = (got - want).abs().max().item() / rms
        result["rel_frobenius"] = ((got - want).norm() / want.norm()).item()
        print(f"outputs: max |patched - plain| / RMS = {result['max_abs_diff_over_rms']:.3g}, "
              f"relative Frobenius {result['rel_frobenius']:.3g}", flush=True)
        del want, got

        for mode in args.modes.split(","):
            started = time.perf_counter()
            try:
                sides = _sides(mode, plain, patched, ids, result)
                figures = paired(sides[0], sides[1], args.blocks, args.calls)
            except Exception as err:  # one mode failing (a capture the model refuses) leaves the others
                result["modes"][mode] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
                print(f"{mode}: {result['modes'][mode]['error']}", flush=True)
                continue
            figures["setup_and_timing_s"] = time.perf_counter() - started
            result["modes"][mode] = figures
            print(f"{mode}: plain {figures['plain']['median_ms']:.3f} ms, patched "
                  f"{figures['patched']['median_ms']:.3f} ms per forward, ratio {figures['ratio']:.4f} "
                  f"(p20-p80 of block ratios {figures['ratio_p20_p80'][0]:.4f}-{figures['ratio_p20_p80'][1]:.4f})",
                  flush=True)
            args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host time of the three operators' dispatch, on the CPU, no GPU: what a call of
`torch.ops.cutlass_tune.mm`, `.linear` and `.grouped_mm` costs in each way a model calls it,
beside torch's own operator of the same math on the same tensors.

    python3 benchmarks/op_python_path.py [--calls 5000] [--reps 7] [--json OUT.json]

Per operator, microseconds per call (the fastest of `--reps` blocks of `--calls` calls):

- torch: torch's operator of the same math (torch.mm; F.linear then GELU; torch._grouped_mm),
- direct: the operator's CUDA kernel called as a Python function (`mm_direct`, `linear_direct`,
  `cutlass_tune.grouped_mm`: what eager inference calls),
- op no_grad: the operator under torch.no_grad,
- op grad: the operator with grad mode on and no input requiring grad,
- torch compiled, op compiled: a function of the one call under torch.compile (inductor, CPU
  tensors), called under no_grad.

Test doubles stand for the GPU (see grouped_python_path.py): the operators' CPU kernels are their
CUDA kernels; the grouped path runs to a no-op ctypes launch; the dense operators' `matmul` (the
package's cached dispatch and launch, which this comparison does not change) is a double that
allocates the result. The tensors are small, so torch's columns are mostly its dispatch too.
These are CPU-only figures; the GPU host's (benchmarks/grouped_host.py, linear_host.py) add
torch's CUDA calls and a slower Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pandas as pd
import torch
import torch.nn.functional as F
from grouped_python_path import doubles, per_call_us  # beside this script

from cutlass_tune.runtime import BestTable, _grouped, _op, register_table
from cutlass_tune.runtime._registration import KERNELS

M, N, K, E = 8, 32, 32, 4


def _result_of_matmul(a: torch.Tensor, b: torch.Tensor, table: object, out_dtype: torch.dtype | None = None,
                      **kwargs: object) -> torch.Tensor:
    """Stands for `matmul`'s launch: the result allocated, nothing computed."""
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


@contextlib.contextmanager
def cuda_kernels_on_cpu() -> Iterator[None]:
    """Each operator's CPU kernel replaced by its CUDA kernel."""
    with contextlib.ExitStack() as stack:
        for kernels in KERNELS.values():
            stack.enter_context(mock.patch.dict(kernels, {"cpu": kernels["cuda"]}))
        yield


def cases(key: str, table: BestTable) -> dict[str, dict[str, Callable[[], object]]]:
    """Per operator, the calls timed (see the module docstring)."""
    torch.manual_seed(0)
    a = torch.randn(M, K, dtype=torch.float32)
    w = torch.randn(N, K, dtype=torch.float32)
    bias = torch.randn(N, dtype=torch.float32)
    a16 = a.bfloat16()  # torch._grouped_mm takes bfloat16 only
    b3 = torch.randn(E, N, K, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, E + 1, dtype=torch.int32) * (M // E)
    ops = torch.ops.cutlass_tune
    torch._dynamo.reset()
    compiled = {
        "mm": (torch.compile(lambda a, w: torch.mm(a, w.t())), torch.compile(lambda a, w: ops.mm(a, w.t(), key))),
        "linear": (torch.compile(lambda a, w, bias: F.gelu(F.linear(a, w, bias))),
                   torch.compile(lambda a, w, bias: ops.linear(a, w, bias, "gelu", key))),
        "grouped_mm": (torch.compile(lambda a, b, offs: torch._grouped_mm(a, b, offs)),
                       torch.compile(lambda a, b, offs: ops.grouped_mm(a, b, offs, key))),
    }
    return {
        "mm": {
            "torch": lambda: torch.mm(a, w.t()),
            "direct": lambda: _op.mm_direct(a, w.t(), key),
            "op": lambda: ops.mm(a, w.t(), key),
            "torch compiled": lambda: compiled["mm"][0](a, w),
            "op compiled": lambda: compiled["mm"][1](a, w),
        },
        "linear": {
            "torch": lambda: F.gelu(F.linear(a, w, bias)),
            "direct": lambda: _op.linear_direct(a, w, bias, "gelu", key),
            "op": lambda: ops.linear(a, w, bias, "gelu", key),
            "torch compiled": lambda: compiled["linear"][0](a, w, bias),
            "op compiled": lambda: compiled["linear"][1](a, w, bias),
        },
        "grouped_mm": {
            "torch": lambda: torch._grouped_mm(a16, b3, offs),
            "direct": lambda: _grouped.grouped_mm(a16, b3, offs, table=table),
            "op": lambda: ops.grouped_mm(a16, b3, offs, key),
            "torch compiled": lambda: compiled["grouped_mm"][0](a16, b3, offs),
            "op compiled": lambda: compiled["grouped_mm"][1](a16, b3, offs),
        },
    }


def measure(calls: int, reps: int) -> dict[str, dict[str, float]]:
    """Microseconds per call: {operator: {way: us}} (ways: torch, direct, op no_grad, op grad,
    torch compiled, op compiled)."""
    table = BestTable(pd.DataFrame({"m": [], "n": [], "k": []}))
    key = register_table(table, key="op-python-path")
    us: dict[str, dict[str, float]] = {}
    with warnings.catch_warnings(), doubles(table), cuda_kernels_on_cpu(), \
            mock.patch.object(_op, "matmul", _result_of_matmul):
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to torch would time torch, not this path
        for name, ways in cases(key, table).items():
            row = us[name] = {}
            with torch.no_grad():
                for way in ("torch", "direct", "op"):
                    row[way if way != "op" else "op no_grad"] = per_call_us(ways[way], calls, reps)
            row["op grad"] = per_call_us(ways["op"], calls, reps)
            with torch.no_grad():
                for way in ("torch compiled", "op compiled"):
                    row[way] = per_call_us(ways[way], calls, reps)
    return us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    us = measure(args.calls, args.reps)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "calls": args.calls, "us": us}, indent=2) + "\n")
    ways = list(next(iter(us.values())))
    print(f"{'operator':<12}" + "".join(f"{w:>16}" for w in ways))
    for name, row in us.items():
        print(f"{name:<12}" + "".join(f"{row[w]:>16.2f}" for w in ways))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host time of the grouped GEMM's Python path, on the CPU, no GPU: what a call of
`cutlass_tune.grouped_mm` and of `torch.ops.cutlass_tune.grouped_mm` costs before the kernel's
launch, the launch itself a no-op.

    python3 benchmarks/grouped_python_path.py [--calls 10000] [--reps 7] [--json OUT.json]

Test doubles stand for the GPU at its edges only: the loaded kernel library (`LoadedKernel`,
its ctypes entry points) does nothing, the current stream's handle is a constant, the tensors are
CPU tensors that report CUDA device 0 (`Tensor.get_device`), the operator's CPU kernel is its
CUDA one, and the table's lookup answers with one grouped row. Everything between the call and
the ctypes launch is the package's own code. These are CPU-only figures of the Python path; the
GPU's host time per call (benchmarks/grouped_host.py) adds torch's CUDA calls (the raw stream
accessor, allocations on the device, the launch itself).

Prints microseconds per call (the fastest of `--reps` blocks of `--calls` calls) for the direct call
(eager, kept workspace) and the operator under no_grad.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pandas as pd
import torch

from cutlass_tune.runtime import BestTable, _dispatch, _grouped, _grouped_op, _matmul, register_table
from cutlass_tune.space import (
    DType,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RuntimeArgs,
    TileScheduler,
)
from cutlass_tune.tables import BundledKernel

E, N, K, M = 128, 1536, 2048, 64  # qwen3 gate_up's experts, few rows (the operands are CPU tensors)


class _Instance:
    def initialize(self, args: object, workspace: object, stream: object) -> None:
        pass

    def run(self, stream: object) -> None:
        pass

    def close(self) -> None:
        pass


class _Kernel:
    """Stands for `LoadedKernel`: the ctypes entry points, each a no-op."""

    def __init__(self, library: object, symbol: str):
        self.library, self.symbol = library, symbol

    def workspace_size(self, args: object) -> int:
        return 64 * E

    def create(self) -> _Instance:
        return _Instance()


class _Rows:
    """Stands for the device's rows of a table: one grouped row for every lookup."""

    def __init__(self, config: KernelConfig, ratio: float):
        self.row = pd.Series({"config": json.dumps(config.to_dict()), "config_hash": "h", "ratio": ratio,
                              "ratio_low": ratio, "kernel": config.name})
        self.runtime = RuntimeArgs()
        self.exact = False
        self.ratio = ratio

    def find(self, *args: object, **kwargs: object) -> _Rows:
        return self


def _problem(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None = None,
             scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> Problem:
    e, k, n = b.shape
    return Problem.experts(e, n, k, a.shape[0], dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
                           layout_b=Layout.COL)


@contextlib.contextmanager
def doubles(table: BestTable) -> Iterator[None]:
    """The GPU's edges replaced (see the module docstring)."""
    config = KernelConfig(tile_m=128, tile_n=128, tile_k=64, kernel_schedule=KernelSchedule.COOPERATIVE,
                          tile_scheduler=TileScheduler.PERSISTENT, layout_b=Layout.COL, grouping=Grouping.GROUPED)
    table.bundled = {"h": BundledKernel(Path("unused.so"), "k0")}
    cuda_kernel = _grouped_op.grouped_mm_op._backend_fns["cuda"]
    with contextlib.ExitStack() as stack:
        for target, name, value in [
            (_matmul, "LoadedKernel", _Kernel), (_grouped, "current_stream", lambda device: 7),
            (_grouped, "bind_primary_context", lambda device: None), (_grouped, "sm_count", lambda device: 132),
            (_dispatch, "_device_rows", lambda table, device: (_Rows(config, 1.2), None)),
            (_grouped, "grouped_problem_of", _problem),
            (torch.cuda, "is_current_stream_capturing", lambda: False),
            (torch.Tensor, "get_device", lambda self: 0),
            (_grouped_op.grouped_mm_op._backend_fns, "cpu", cuda_kernel),
        ]:
            if isinstance(target, dict):
                stack.enter_context(mock.patch.dict(target, {name: value}))
            else:
                stack.enter_context(mock.patch.object(target, name, value))
        yield
    _dispatch.clear_loaded()


def per_call_us(fn: Callable[[], object], calls: int, reps: int) -> float:
    for _ in range(100):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)  # the least disturbed block: this host's other processes only add time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    table = BestTable(pd.DataFrame({"m": [], "n": [], "k": []}))
    key = register_table(table, key="grouped-python-path")
    torch.manual_seed(0)
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(E, N, K, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, E + 1, dtype=torch.int32) * (M // E)
    us = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # a fallback to torch would time torch, not this path
        with doubles(table):
            us["cutlass_tune.grouped_mm"] = per_call_us(lambda: _grouped.grouped_mm(a, b, offs, table=table),
                                                        args.calls, args.reps)
            us["torch.ops.cutlass_tune.grouped_mm"] = per_call_us(
                lambda: torch.ops.cutlass_tune.grouped_mm(a, b, offs, key), args.calls, args.reps)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "calls": args.calls, "us": us}, indent=2) + "\n")
    for name, value in us.items():
        print(f"{name:<36} {value:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

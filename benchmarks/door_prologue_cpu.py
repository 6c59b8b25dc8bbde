"""Host time of the function doors' Python prologue, on the CPU: `cutlass_tune.matmul` and
`cutlass_tune.grouped_mm` up to their call of the native library, which a no-op of the same
signature stands in for (`_native.door`), on CPU tensors (the prologue reads no device).

    PYTHONPATH=. python3 benchmarks/door_prologue_cpu.py [--calls 20000] [--reps 15]

Run from a checkout's root: it times that checkout's package (PYTHONPATH=.). Prints
microseconds per call, the fastest of `--reps` blocks of `--calls` calls: each door called as a
function imported once, then as the package's attribute (`cutlass_tune.matmul`, as a model's code
and benchmarks/host_path.py call it), and the no-op called directly (the floor); the prologue is
a door's time less the floor. To compare two checkouts on a shared host, run them alternately,
several times each.
"""

from __future__ import annotations

import argparse
import timeit

import pandas as pd
import torch

import cutlass_tune
from cutlass_tune.runtime import BestTable, _native, grouped_mm, matmul


class _NoOpDoor:
    """The library's two door entry points, doing nothing."""

    @staticmethod
    def matmul(a, b, key, out_dtype, scale_a, scale_b, min_ratio):  # noqa: ANN001, ANN205
        return a

    @staticmethod
    def grouped_mm(a, b, offs, key, out_dtype, keep_workspace, min_ratio):  # noqa: ANN001, ANN205
        return a

    @staticmethod
    def forget(key):  # noqa: ANN001, ANN205
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    noop = _NoOpDoor()
    _native.door = noop  # type: ignore[assignment]
    _native._module = noop  # type: ignore[assignment]
    table = BestTable(pd.DataFrame({"m": [1], "n": [1], "k": [1]}))
    a, b = torch.empty(64, 1024, dtype=torch.bfloat16), torch.empty(1024, 1024, dtype=torch.bfloat16)
    a8, b8 = torch.empty(64, 1024, dtype=torch.float8_e4m3fn), torch.empty(1024, 1024, dtype=torch.float8_e4m3fn)
    sa, sb = torch.ones(64, 1), torch.ones(1, 1024)
    w, offs = torch.empty(8, 1024, 1024, dtype=torch.bfloat16), torch.tensor([8] * 8, dtype=torch.int32)
    key = _native.door_key(table)
    cases = {
        "floor: the no-op door": lambda: noop.matmul(a, b, key, None, None, None, 1.0),
        "matmul (bf16)": lambda: matmul(a, b, table),
        "matmul (fp8 row-wise)": lambda: matmul(a8, b8, table, scale_a=sa, scale_b=sb),
        "grouped_mm (bf16)": lambda: grouped_mm(a, w, offs, table=table),
        "cutlass_tune.matmul (bf16)": lambda: cutlass_tune.matmul(a, b, table),
        "cutlass_tune.grouped_mm": lambda: cutlass_tune.grouped_mm(a, w, offs, table=table),
    }
    with torch.no_grad():
        for name, call in cases.items():
            assert call() is a or call() is a8
            best = min(timeit.repeat(call, number=args.calls, repeat=args.reps)) / args.calls * 1e6
            print(f"{name:28s} {best:6.3f} us")


if __name__ == "__main__":
    main()

"""Dispatcher cost of an operator defined in Python, on the CPU: `torch.library.custom_op` against
`torch.library.Library.define`/`impl` with the same trivial kernel (it returns a tensor made
beforehand), called as `torch.ops.bench.<op>.default(x, "key", False)`, with and without grad mode.

    python3 benchmarks/op_registration_cpu.py [--calls 20000] [--reps 5]

Prints microseconds per call, the fastest of `--reps` blocks of `--calls` calls, and the plain
Python function's as the floor (benchmarks/moe_glu.md: the GLU stage's operator).
"""

from __future__ import annotations

import argparse
import timeit

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    x, out = torch.ones(4), torch.ones(4)

    def kernel(a: torch.Tensor, key: str, flag: bool) -> torch.Tensor:
        return out

    custom = torch.library.custom_op("bench::via_custom_op", mutates_args=(), device_types="cpu")(kernel)
    custom.register_fake(lambda a, key, flag: torch.empty_like(a))
    lib = torch.library.Library("bench", "FRAGMENT")
    lib.define("via_library(Tensor a, str key, bool flag) -> Tensor")
    lib.impl("via_library", kernel, "CPU")
    ops = {"custom_op": torch.ops.bench.via_custom_op.default,
           "Library.define/impl": torch.ops.bench.via_library.default, "the Python function": kernel}
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for name, op in ops.items():
                best = min(timeit.repeat(lambda op=op: op(x, "key", False), number=args.calls, repeat=args.reps))
                print(f"{name:22s} grad {'on ' if grad else 'off'} {best / args.calls * 1e6:6.2f} us")


if __name__ == "__main__":
    main()

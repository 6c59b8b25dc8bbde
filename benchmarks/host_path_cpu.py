"""Host time per call of the tuned GEMM's doors, on the CPU, no GPU: the package's Python path
from the call to the (no-op) kernel launch, per door.

    python3 benchmarks/host_path_cpu.py [--against OTHER_CHECKOUT] [--calls 2000] [--reps 15] [--json OUT]

It times the package of the current directory (not an installed one) and, with `--against`, the
one of another checkout: one server process per package, their blocks of `--calls` calls
alternating door by door, the fastest of `--reps` blocks kept (on a shared host, blocks adjacent
in time meet the same load; a run of one package after the other does not).

Doors (microseconds per call, under no_grad):

- dense: `cutlass_tune.matmul`; a patched `cutlass_tune.nn.Linear` without bias (eager, its direct path);
  `torch.ops.cutlass_tune.mm` and `.linear` (bias + GELU) called eagerly;
- grouped: `cutlass_tune.grouped_mm`; `torch.ops.cutlass_tune.grouped_mm` eagerly and inside a
  torch.compile'd function (inductor, CPU).

Test doubles stand for the GPU at its edges only, the same names patched in every version of the
package this script is run on: the kernel library (`LoadedKernel`: no-op entry points), the
stream's handle, the device's name and SM count, CPU tensors that report CUDA device 0 (`device`,
`is_cuda`, `get_device`; `torch.empty` drops a device argument), each operator's CPU kernel its
CUDA one, and the table's lookup (`BestTable.find`) answering with one row whose kernel is
bundled. Everything between the call and the ctypes launch is the package's own code. The
compiled dense operators are not timed: their path reads `device`, which a compiled graph's CPU
tensors cannot fake. These are CPU figures; a GPU host adds torch's CUDA calls and the launch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pandas as pd
import torch

import cutlass_tune
from cutlass_tune.runtime import BestTable, _grouped, _grouped_op, _matmul, _op, register_table
from cutlass_tune.runtime._table import Match
from cutlass_tune.space import Grouping, KernelConfig, KernelSchedule, Layout, RuntimeArgs, TileScheduler
from cutlass_tune.tables import BundledKernel

M, N, K, E = 64, 1024, 1024, 8
CUDA = torch.device("cuda", 0)
_EMPTY = torch.empty


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
        self.library, self.symbol = Path(str(library)), symbol

    def workspace_size(self, args: object) -> int:
        return 0

    def create(self) -> _Instance:
        return _Instance()


DENSE = KernelConfig(tile_m=128, tile_n=128, tile_k=64)
GROUPED = KernelConfig(tile_m=128, tile_n=128, tile_k=64, kernel_schedule=KernelSchedule.COOPERATIVE,
                       tile_scheduler=TileScheduler.PERSISTENT, layout_b=Layout.COL, grouping=Grouping.GROUPED)


def _match(config: KernelConfig) -> Match:
    runtime = RuntimeArgs()
    return Match(pd.Series({"config": json.dumps(config.to_dict()), "config_hash": config.hash, "ratio": 1.2,
                            "kernel": config.name, "raster": runtime.raster.name.lower(), "swizzle": runtime.swizzle,
                            "splits": runtime.splits, "decomposition": runtime.decomposition.name.lower()}),
                 exact=True, distance=0.0)


def _find(self: BestTable, m: int, n: int, k: int, operation: object, *, groups: int = 0) -> Match:
    return _match(GROUPED if groups else DENSE)


def _empty(*size: object, device: object = None, **kwargs: object) -> torch.Tensor:
    return _EMPTY(*size, **kwargs)  # type: ignore[call-overload]


@contextlib.contextmanager
def doubles(on_cuda: bool) -> Iterator[None]:
    """The GPU's edges replaced (see the module docstring); `on_cuda`: tensors report CUDA device 0."""
    patches: list[tuple[object, str, object]] = [
        (_matmul, "LoadedKernel", _Kernel), (_matmul, "bind_primary_context", lambda device: None),
        (_grouped, "bind_primary_context", lambda device: None),
        (torch._C, "_cuda_getCurrentRawStream", lambda device: 7),
        (torch.cuda, "is_current_stream_capturing", lambda: False), (torch.Tensor, "get_device", lambda self: 0),
        (BestTable, "find", _find),
    ]
    if on_cuda:  # inductor reads the device's properties where it finds a CUDA device: not while compiling
        patches += [(torch.cuda, "get_device_properties",
                     lambda device: types.SimpleNamespace(multi_processor_count=132)),
                    (torch.cuda, "get_device_name", lambda device=None: "bench GPU"),
                    (torch.cuda, "current_device", lambda: 0), (torch.Tensor, "device", property(lambda self: CUDA)),
                    (torch.Tensor, "is_cuda", property(lambda self: True)), (torch, "empty", _empty)]
    with contextlib.ExitStack() as stack:
        for target, name, value in patches:
            stack.enter_context(mock.patch.object(target, name, value, create=True))
        for op in (_op.mm, _op.linear, _grouped_op.grouped_mm_op):
            stack.enter_context(mock.patch.dict(op._backend_fns, {"cpu": op._backend_fns["cuda"]}))
        yield


def block_us(fn: Callable[[], object], calls: int) -> float:
    """Microseconds per call over one block of `calls` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def doors() -> dict[str, tuple[bool, Callable[[], object]]]:
    """The calls timed by door: (whether tensors report CUDA while it runs, the call). Each has
    run 100 times (its plan resolved) when this returns."""
    table = BestTable(pd.DataFrame({"m": [M], "n": [N], "k": [K]}),
                      bundled={c.hash: BundledKernel(Path("unused.so"), "k0") for c in (DENSE, GROUPED)})
    key = register_table(table, key="host-path-cpu")
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randn(N, K, dtype=torch.bfloat16)
    bias = torch.randn(N, dtype=torch.bfloat16)
    b3 = torch.randn(E, N, K, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, E + 1, dtype=torch.int32) * (M // E)
    layer = cutlass_tune.nn.Linear.from_linear(torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16), table)
    ops = torch.ops.cutlass_tune
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b, offs: ops.grouped_mm(x, b, offs, key))
    found: dict[str, tuple[bool, Callable[[], object]]] = {
        "matmul": (True, lambda: cutlass_tune.matmul(x, w.t(), table)),
        "nn.Linear (direct)": (True, lambda: layer(x)),
        "op mm": (True, lambda: ops.mm(x, w.t(), key)),
        "op linear bias+gelu": (True, lambda: ops.linear(x, w, bias, "gelu", key)),
        "grouped_mm": (True, lambda: cutlass_tune.grouped_mm(x, b3, offs, table=table)),
        "op grouped_mm": (True, lambda: ops.grouped_mm(x, b3, offs, key)),
        # its plan is resolved by the eager calls before it; its fast path reads get_device only
        "op grouped_mm compiled": (False, lambda: compiled(x, b3, offs)),
    }
    for on_cuda, fn in found.values():
        with doubles(on_cuda):
            block_us(fn, 100)
    return found


def serve() -> None:
    """Answers lines "door calls" on stdin with one block's microseconds per call (`--serve`)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to torch would time torch, not this path
        timed = doors()
        print(json.dumps({"package": str(Path(cutlass_tune.__file__).parent), "doors": list(timed)}), flush=True)
        for line in sys.stdin:
            name, calls = line.rsplit(" ", 1)
            on_cuda, fn = timed[name]
            with doubles(on_cuda):
                print(block_us(fn, int(calls)), flush=True)


def compare(packages: list[str], calls: int, reps: int) -> dict[str, dict[str, float]]:
    """The fastest block per door of each package's `--serve` process, their blocks alternating
    (each door's blocks adjacent in time, the order flipped every round): load on the host
    reaches both alike."""
    workers = [subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=package, env={**os.environ, "PYTHONPATH": package})
               for package in packages]
    heads = [json.loads(w.stdout.readline()) for w in workers]  # type: ignore[union-attr]
    best: dict[str, dict[str, float]] = {p: {} for p in packages}
    for rep in range(reps):
        for name in heads[0]["doors"]:
            order = list(zip(packages, workers))
            for package, worker in order if rep % 2 == 0 else order[::-1]:
                worker.stdin.write(f"{name} {calls}\n")  # type: ignore[union-attr]
                worker.stdin.flush()  # type: ignore[union-attr]
                us = float(worker.stdout.readline())  # type: ignore[union-attr]
                best[package][name] = min(us, best[package].get(name, math.inf))
    for worker in workers:
        worker.stdin.close()  # type: ignore[union-attr]
        worker.wait()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--against", metavar="DIR", help="also time the package of this checkout, alternating")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    here = os.getcwd()
    packages = [args.against, here] if args.against else [here]
    best = compare(packages, args.calls, args.reps)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "calls": args.calls, "reps": args.reps,
                                         "us": best}, indent=2) + "\n")
    print(f"{'door':<26}" + "".join(f"{Path(p).name:>16}" for p in packages))
    for name in best[here]:
        print(f"{name:<26}" + "".join(f"{best[p][name]:>13.2f} us" for p in packages))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host time per call of the tuned GEMM's doors, on the CPU, no GPU: the package's Python path
from the call to the (no-op) kernel launch, per door.

    PYTHONPATH=. python3 benchmarks/host_path_cpu.py [--calls 5000] [--reps 3] [--json OUT.json]

(PYTHONPATH: the package of the current directory, not an installed one; the script also prints
which it timed.)

Doors (microseconds per call, the fastest of `--reps` blocks of `--calls` calls, under no_grad):

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


def measure(calls: int, reps: int) -> dict[str, float]:
    """Microseconds per call by door (see the module docstring)."""
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
    eager = {
        "matmul": lambda: cutlass_tune.matmul(x, w.t(), table),
        "nn.Linear (direct)": lambda: layer(x),
        "op mm": lambda: ops.mm(x, w.t(), key),
        "op linear bias+gelu": lambda: ops.linear(x, w, bias, "gelu", key),
        "grouped_mm": lambda: cutlass_tune.grouped_mm(x, b3, offs, table=table),
        "op grouped_mm": lambda: ops.grouped_mm(x, b3, offs, key),
    }
    us = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to torch would time torch, not this path
        with doubles(on_cuda=True):
            for name, fn in eager.items():
                us[name] = per_call_us(fn, calls, reps)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, b, offs: ops.grouped_mm(x, b, offs, key))
        with doubles(on_cuda=False):  # its plan was resolved above; the fast path reads get_device only
            us["op grouped_mm compiled"] = per_call_us(lambda: compiled(x, b3, offs), calls, reps)
    return us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    us = measure(args.calls, args.reps)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "calls": args.calls, "us": us}, indent=2) + "\n")
    print(f"package: {Path(cutlass_tune.__file__).parent}")
    for name, value in us.items():
        print(f"{name:<26}{value:>10.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

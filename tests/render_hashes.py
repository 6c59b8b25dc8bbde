"""Write tests/data/render_hashes.json: a sample of configs of every kind of operation and the
sha256 of the unit each renders to (`RenderedKernel.key`), for tests/test_render_hashes.py.

Run from a checkout whose render output is the reference (the expected hashes are that
checkout's): `python3 -m tests.render_hashes [OUT]`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from cutlass_tune.render import render_unit
from cutlass_tune.space import (
    Activation,
    AutoKernels,
    DType,
    Epilogue,
    Grouping,
    KernelConfig,
    Operation,
    Scaling,
)

FP8 = {"dtype_a": DType.E4M3, "dtype_b": DType.E4M3}
GROUPED = {"grouping": Grouping.GROUPED}
OPERATIONS = {
    "dense bf16": Operation(),
    "dense bf16 bias+silu": Operation(epilogue=Epilogue(bias=True, activation=Activation.SILU)),
    "dense bf16 residual": Operation(epilogue=Epilogue(residual=True)),
    "dense bf16 gated": Operation(epilogue=Epilogue(gated=True, activation=Activation.GELU_TANH)),
    "dense f16 f32": Operation(dtype_a=DType.F16, dtype_b=DType.F16, dtype_d=DType.F32),
    "fp8 tensor": Operation(**FP8, scaling=Scaling.TENSOR),
    "fp8 rowcol": Operation(**FP8, scaling=Scaling.ROWCOL),
    "fp8 rowcol bias+gelu": Operation(**FP8, scaling=Scaling.ROWCOL,
                                      epilogue=Epilogue(bias=True, activation=Activation.GELU)),
    "fp8 unscaled e5m2": Operation(dtype_a=DType.E4M3, dtype_b=DType.E5M2, dtype_d=DType.F32),
    "blockwise": Operation(**FP8, scaling=Scaling.BLOCKWISE),
    "blockwise bias+relu": Operation(**FP8, scaling=Scaling.BLOCKWISE,
                                     epilogue=Epilogue(bias=True, activation=Activation.RELU)),
    "grouped bf16": Operation(**GROUPED),
    "grouped f16": Operation(dtype_a=DType.F16, dtype_b=DType.F16, dtype_d=DType.F16, **GROUPED),
    "grouped fp8 blockwise": Operation(**FP8, scaling=Scaling.BLOCKWISE, **GROUPED),
}
PER_KIND = 12
"""Configs sampled of each operation, and as many again of its swapped ones where it has them."""


def sample() -> dict[str, list[list[KernelConfig]]]:
    """Units to render, by kind: one config each, then one unit mixing a config of every kind."""
    rng = random.Random(20261128)
    units: dict[str, list[list[KernelConfig]]] = {}
    for label, operation in OPERATIONS.items():
        configs = list(AutoKernels(operation))
        plain = [c for c in configs if not c.swap_ab]
        units[label] = [[c] for c in rng.sample(plain, min(PER_KIND, len(plain)))]
        swapped = [c for c in configs if c.swap_ab]
        if swapped:
            units[f"{label} swap"] = [[c] for c in rng.sample(swapped, min(PER_KIND, len(swapped)))]
    units["mixed unit"] = [[unit[0][0] for unit in units.values()]]
    return units


def main(out: str = "tests/data/render_hashes.json") -> None:
    data = {label: [{"configs": [c.to_dict() for c in unit], "key": render_unit(unit).key} for unit in group]
            for label, group in sample().items()}
    Path(out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Where a compiled fp8 model's step spends host time: the product's side against torch's model.

    TORCH_LOGS=output_code python3 benchmarks/fp8_step_host.py OUT [--tokens 128] [--table BUNDLE] \
        [--dispatcher] 2> OUT/output_code.txt

The model of `benchmarks/tune_model_fp8.py` (4 Llama-3-8B-shaped fp8 blocks, 16 row-wise GEMMs a
step), compiled (default mode), on two sides with the same weights: "product" (every Linear an
`Fp8Linear`, its GEMM `torch.ops.cutlass_tune.scaled_mm` on `--table`, or on a table without rows:
torch._scaled_mm called from C++, the plan's fast accumulation off as the fallback's default) and
"torch" (`build_torch`: torch._scaled_mm with fast accumulation, called by Inductor directly);
with `--dispatcher` a third, "product-dispatcher": the product's model compiled with its operators
called through the dispatcher, as before runtime/_lowering.py made them Inductor's extern kernels.

Measured per side, the sides alternating: the host time of a step with the GPU kept busy (a GPU
sleep ahead of each block of a few steps, so the host only enqueues: its wall time per step,
median of `--reps` blocks, `_blocks.host_ms`; a block of more steps than CUDA's launch queue
holds times the sleep, which `host_waited` says),
the GPU time of a step (CUDA events, blocks back to back), and a cProfile of `--profile-blocks`
blocks (the GPU kept busy likewise) written as OUT/cprofile-SIDE.txt, the top functions by own
time. `TORCH_LOGS=output_code` puts Inductor's generated wrappers on stderr: what each side's step
calls per GEMM. Writes OUT/step_host.json and prints one line a side.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from _blocks import BUSY_CYCLES, block_ms, host_ms  # beside this file


def profiled(step: Callable[[], object], steps: int, blocks: int, top: int = 40) -> str:
    """The top `top` functions by own time over `blocks` blocks of `steps` steps, each block
    enqueued behind a GPU sleep (the profile covers the enqueueing only)."""
    profile = cProfile.Profile()
    for _ in range(blocks):
        torch.cuda._sleep(BUSY_CYCLES)
        profile.enable()
        for _ in range(steps):
            step()
        profile.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def sides(tokens: int, table: str | None, dispatcher: bool = False) -> dict[str, Callable[[], object]]:
    """Each side's compiled step (no_grad), warmed; with `dispatcher`, a third side: the product's
    model compiled with its operators called through the dispatcher (`_lowering.through_dispatcher`),
    where "product" calls them as Inductor's extern kernels."""
    import tune_model_fp8 as fp8

    from cutlass_tune import BestTable, register_table
    from cutlass_tune.bench._in_model import TABLE_KEY

    if table is not None:
        register_table(BestTable.load(table), key=TABLE_KEY)
    from cutlass_tune.runtime import _lowering

    out = {}
    builds = [("product", fp8.build, contextlib.nullcontext), ("torch", fp8.build_torch, contextlib.nullcontext)]
    if dispatcher:
        builds.insert(1, ("product-dispatcher", fp8.build, _lowering.through_dispatcher))
    for name, build, compiling in builds:
        model, (x,) = build(tokens)
        # The dispatcher side compiles a frame of its own: through torch.compile(model) it would
        # share the model class's forward, and Dynamo would serve it the product's graph.
        run = torch.compile(lambda x, model=model: model(x)) if name == "product-dispatcher" else torch.compile(model)

        def step(run=run, x=x) -> object:
            with torch.no_grad():
                return run(x)

        with compiling():  # torch.compile compiles at the first calls
            for _ in range(3):
                step()
        out[name] = step
    torch.cuda.synchronize()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--table", help="a bundle or table for the product's side (default: none, torch's path)")
    parser.add_argument("--steps", type=int, default=5,
                        help="steps a block (few: a block's ~50 launches a step must fit CUDA's launch queue, "
                             "else the host waits on the GPU and the block times the sleep)")
    parser.add_argument("--reps", type=int, default=21, help="blocks a side, the sides alternating")
    parser.add_argument("--profile-blocks", type=int, default=20, help="blocks of --steps steps profiled a side")
    parser.add_argument("--dispatcher", action="store_true",
                        help="a third side: the product's operators called through the dispatcher, not as "
                             "Inductor's extern kernels")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_step_host.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    steps = sides(args.tokens, args.table, args.dispatcher)
    host: dict[str, list[float]] = {name: [] for name in steps}
    gpu: dict[str, list[float]] = {name: [] for name in steps}
    waited = dict.fromkeys(steps, False)  # a block that outlasted the GPU sleep timed the GPU, not the host
    for rep in range(args.reps):
        order = list(steps) if rep % 2 == 0 else list(reversed(steps))
        for name in order:
            ms, late = host_ms(steps[name], args.steps, reps=1, warm=0)
            host[name].append(ms * 1e3)
            waited[name] |= late
            gpu[name].append(block_ms(steps[name], args.steps) * 1e3)
    for name, step in steps.items():
        if args.profile_blocks:
            (args.out / f"cprofile-{name}.txt").write_text(profiled(step, args.steps, args.profile_blocks))
    from cutlass_tune.runtime import _native

    result = {"tokens": args.tokens, "table": args.table, "native": _native.available(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "host_us": host, "gpu_us": gpu, "host_waited": waited,
              "median": {name: {"host_us": statistics.median(host[name]), "gpu_us": statistics.median(gpu[name])}
                         for name in steps}}
    (args.out / "step_host.json").write_text(json.dumps(result, indent=1))
    for name, m in result["median"].items():
        print(f"{name:18} host {m['host_us']:8.1f} us a step ({m['host_us'] / 16:5.1f} a GEMM)  "
              f"GPU back to back {m['gpu_us']:8.1f} us a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far correct kernels sit from the correctness bounds: per output type, fp8 accumulation
mode and problem, the largest relative Frobenius error and the largest single-element error
(in units of the reference's RMS) that verified kernels and cuBLAS showed, next to the bounds
of `cutlass_tune.bench._verify`.

    python3 benchmarks/verify_margins.py results.jsonl   # from `cutlass-tune bench ... -o`
"""

from __future__ import annotations

import sys
from collections import defaultdict

from cutlass_tune.bench._verify import element_tolerance, tolerance
from cutlass_tune.measurement import read_jsonl
from cutlass_tune.status import Status


def main(path: str) -> None:
    measurements = list(read_jsonl(path))
    groups: dict[tuple, list] = defaultdict(list)
    for m in measurements:
        if m.worst_error is None:
            continue
        p = m.problem
        mode = "cuBLAS" if m.is_baseline else ("fast accum" if m.config.fp8_fast_accum else "kernels")
        groups[(f"{p.dtype_a.value} -> {p.dtype_d.value}", mode, f"{p.m}x{p.n}x{p.k}")].append(m)
    env = next((m.env for m in measurements if m.env), None)
    print(f"{env.gpu if env else '?'}; {len(measurements)} measurements from {path}")
    print("| types | who | problem | verified | wrong | max relative error (bound) | max worst element, RMS (bound) |")
    print("|---|---|---|---|---|---|---|")
    for (types, mode, problem), ms in sorted(groups.items()):
        p = ms[0].problem
        fp8 = p.dtype_a.is_fp8
        ok = [m for m in ms if m.status is not Status.WRONG_RESULT]
        wrong = [m for m in ms if m.status is Status.WRONG_RESULT]
        rel = max((m.rel_error for m in ok if m.rel_error is not None), default=float("nan"))
        worst = max((m.worst_error for m in ok), default=float("nan"))
        print(f"| {types} | {mode} | {problem} | {len(ok)} | {len(wrong)} | {rel:.2e} ({tolerance(p.dtype_d, fp8):g}) "
              f"| {worst:.4f} ({element_tolerance(p.dtype_d, fp8):g}) |")
    for m in measurements:
        if m.status is Status.WRONG_RESULT:
            print(f"wrong: {m.kernel_name} {m.runtime.name} {m.problem.name}: {m.reason}")


if __name__ == "__main__":
    main(sys.argv[1])

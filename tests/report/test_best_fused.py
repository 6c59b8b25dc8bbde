"""Best tables of fused problems from a store: their own rows, the epilogue and scaling
columns, the ratio to torch eager and the one to torch.compile carried over the eager row."""

import json
import math

import pytest

from cutlass_tune import BestTable, load_best
from cutlass_tune.measurement import Measurement
from cutlass_tune.space import Activation, Epilogue, KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

PLAIN = Problem(4096, 4096, 4096)
SILU = Problem(4096, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.SILU))


def _kernel(problem, median_ms, baseline_ms, repeat=0):
    cfg = KernelConfig(epilogue=problem.epilogue)
    return Measurement(problem=problem, config=cfg, runtime=RuntimeArgs(), status=Status.OK, median_ms=median_ms,
                       p20_ms=median_ms, p80_ms=median_ms, samples=50, tflops=problem.flops / (median_ms * 1e9),
                       baseline_median_ms=baseline_ms, repeat=repeat)


def _eager(problem, median_ms, compile_ms, repeat=0):
    return Measurement(problem=problem, config=None, runtime=RuntimeArgs(), status=Status.OK, symbol="torch eager",
                       is_baseline=True, median_ms=median_ms, p20_ms=median_ms, p80_ms=median_ms, samples=50,
                       tflops=problem.flops / (median_ms * 1e9), compile_median_ms=compile_ms, repeat=repeat)


def test_fused_rows_carry_their_epilogue_and_both_ratios(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    plain = Measurement(problem=PLAIN, config=KernelConfig(), runtime=RuntimeArgs(), status=Status.OK,
                        median_ms=0.20, p20_ms=0.2, p80_ms=0.2, samples=50, tflops=PLAIN.flops / 0.2e9,
                        baseline_median_ms=0.21)
    for m in (plain, _eager(SILU, 0.30, 0.25), _kernel(SILU, 0.24, 0.30)):
        store.add(m, gpu="NVIDIA H200", run_id="r1")
    frame = load_best(url)
    by = {r.epilogue: r for r in frame.itertuples()}
    assert set(by) == {"none", "bias+silu"} and set(frame["scaling"]) == {"none"}
    fused = by["bias+silu"]
    assert fused.problem == SILU.name and fused.ratio == pytest.approx(0.30 / 0.24)  # to torch eager
    assert fused.torch_compile_ratio == pytest.approx(0.25 / 0.24)
    assert fused.torch_compile_tflops == pytest.approx(SILU.flops / 0.25e9)
    assert KernelConfig.from_dict(json.loads(fused.config)).epilogue == SILU.epilogue
    assert by["none"].ratio == pytest.approx(0.21 / 0.20)
    assert math.isnan(by["none"].torch_compile_ratio)  # a plain problem has no torch.compile baseline
    table = BestTable(frame)
    assert table.lookup(4096, 4096, 4096, epilogue="bias+silu").row["kernel"] == fused.kernel
    assert table.lookup(4096, 4096, 4096).row["kernel"] == by["none"].kernel

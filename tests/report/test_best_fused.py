"""Best tables of fused problems from a store: their own rows, the epilogue and scaling
columns, the ratio to torch eager and the one to torch.compile carried over the eager row."""

import dataclasses
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


TANH = Problem(4096, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.GELU_TANH))


def _lt_eager(problem, median_ms, compile_ms, lt_ms, repeat=0):
    return dataclasses.replace(_eager(problem, median_ms, compile_ms, repeat), lt_median_ms=lt_ms)


def test_a_fused_row_records_the_strongest_torch_path_and_its_ratio(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    for m in (_lt_eager(TANH, 0.30, 0.28, 0.24), _kernel(TANH, 0.26, 0.30)):
        store.add(m, gpu="NVIDIA H200", run_id="r1")
    row = load_best(url).iloc[0]
    assert row.ratio == pytest.approx(0.30 / 0.26)  # to eager: a winner there ...
    assert row.cublaslt_ratio == pytest.approx(0.24 / 0.26)
    assert row.cublaslt_tflops == pytest.approx(TANH.flops / 0.24e9)
    assert row.strongest == "cuBLASLt epilogue"
    assert row.strongest_ratio == pytest.approx(0.24 / 0.26)  # ... but not against the strongest
    assert row.strongest_tflops == pytest.approx(TANH.flops / 0.24e9)


def test_confirmed_passes_rank_by_the_ratio_to_the_strongest(tmp_path):
    # Guards against ranking a fused problem by its ratio to eager: across passes, eager's lead
    # over cuBLASLt varies, and the kernel that beats eager by most need not beat the strongest.
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    a, b = KernelConfig(epilogue=TANH.epilogue), KernelConfig(epilogue=TANH.epilogue, tile_n=256)
    lt_ms = (0.20, 0.30, 0.30)  # eager / cuBLASLt: 1.5, 1.0, 1.0
    a_ratio, b_ratio = (1.5, 1.0, 1.3), (1.2, 1.2, 1.2)  # to eager: medians 1.3 (a), 1.2 (b)
    for rep in range(3):
        store.add(_lt_eager(TANH, 0.30, 0.31, lt_ms[rep], rep), gpu="NVIDIA H200", run_id="c1", study="confirm")
        for cfg, ratio in ((a, a_ratio[rep]), (b, b_ratio[rep])):
            m = _kernel(TANH, 0.30 / ratio, 0.30, rep)
            store.add(dataclasses.replace(m, config=cfg), gpu="NVIDIA H200", run_id="c1", study="confirm")
    row = load_best(url).iloc[0]
    assert row.config_hash == b.hash  # to the strongest: medians 1.0 (a), 1.2 (b)
    assert row.strongest_ratio == pytest.approx(1.2) and row.ratio == pytest.approx(1.2)
    assert row.confirm_passes == 3


def test_a_plain_row_s_strongest_is_cublas(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    store.add(Measurement(problem=PLAIN, config=KernelConfig(), runtime=RuntimeArgs(), status=Status.OK,
                          median_ms=0.20, p20_ms=0.2, p80_ms=0.2, samples=50, tflops=PLAIN.flops / 0.2e9,
                          baseline_median_ms=0.21), gpu="NVIDIA H200", run_id="r1")
    row = load_best(url).iloc[0]
    assert row.strongest == "cuBLAS" and row.strongest_ratio == pytest.approx(row.ratio)
    assert row.strongest_tflops == pytest.approx(row.cublas_tflops) and math.isnan(row.cublaslt_ratio)


def test_passes_that_timed_a_torch_path_supersede_those_that_could_not(tmp_path):
    """A confirm pass whose baseline could not time torch.compile (it failed its own check)
    named eager the strongest; a later pass timed both. The table's strongest ratio is the later
    pass's, not a median over both."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    early = dataclasses.replace(_eager(SILU, 0.30, None), status=Status.OK)
    store.add(early, gpu="NVIDIA H200", run_id="c1", study="confirm")
    store.add(_kernel(SILU, 0.25, 0.30), gpu="NVIDIA H200", run_id="c1", study="confirm")
    store.add(_eager(SILU, 0.30, 0.26, repeat=0), gpu="NVIDIA H200", run_id="c2", study="confirm")
    store.add(_kernel(SILU, 0.25, 0.30), gpu="NVIDIA H200", run_id="c2", study="confirm")
    row = load_best(url).iloc[0]
    assert row.strongest == "torch.compile"
    assert row.strongest_ratio == pytest.approx(0.26 / 0.25) == row.torch_compile_ratio
    assert row.confirm_passes == 1

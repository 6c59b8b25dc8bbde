"""`cutlass-tune check`'s calls, on the CPU: the tuned side passes each operation's operands to
`matmul` as a model does, and torch's sides compute the entry's math (the GPU timing of both is
tests/bench/test_gpu_sustained.py's)."""

import pytest
import torch

from cutlass_tune.bench import _check
from cutlass_tune.bench._check import torch_functions, tuned_function
from cutlass_tune.bench._verify import allocate, compare, randomize, reference
from cutlass_tune.space import Activation, DType, Epilogue, Problem, Scaling
from cutlass_tune.status import Status

FP8 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)
PROBLEMS = {
    "plain": Problem(64, 48, 32),
    "bias+gelu": Problem(64, 48, 32, epilogue=Epilogue(bias=True, activation=Activation.GELU)),
    "bias+residual": Problem(64, 48, 32, epilogue=Epilogue(bias=True, residual=True)),
    "silu+gated": Problem(64, 48, 32, epilogue=Epilogue(activation=Activation.SILU, gated=True)),
    "fp8 rowcol": Problem(64, 48, 64, scaling=Scaling.ROWCOL, **FP8),
}


def _ops(problem):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(0))
    return ops


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_each_torch_side_computes_the_entrys_math(name):
    # Guards against check timing torch on other math than the kernel's (the earlier check called
    # every entry as a plain GEMM, so a fused entry read "wrong" and its time meant nothing).
    problem = PROBLEMS[name]
    ops = _ops(problem)
    paths = torch_functions(problem, ops)
    expected = {"plain": ["cuBLAS"]}.get(name, ["torch eager", "torch.compile"])
    assert list(paths) == expected
    for label, call in paths.items():
        verdict = compare(call(ops), reference(ops), problem.dtype_d, fp8_inputs=problem.dtype_a.is_fp8)
        assert verdict.status is Status.OK, (label, verdict.reason)


def test_a_side_torch_cannot_make_is_left_out_but_the_baseline_must_run(monkeypatch):
    problem = PROBLEMS["bias+gelu"]
    ops = _ops(problem)

    def refuses(problem, **kwargs):
        def fn(*args):
            raise RuntimeError("no compiler here")
        return fn

    monkeypatch.setattr(_check, "compiled_function", refuses)
    assert list(torch_functions(problem, ops)) == ["torch eager"]
    monkeypatch.setattr(_check, "eager_function", refuses)
    with pytest.raises(RuntimeError, match="no compiler here"):
        torch_functions(problem, ops)


@pytest.mark.parametrize("name, expected", [
    ("plain", dict(bias=None, c=None, gate=None, scale_a=None, scale_b=None, activation=Activation.NONE)),
    ("bias+gelu", dict(bias="bias", c=None, gate=None, scale_a=None, scale_b=None, activation=Activation.GELU)),
    ("bias+residual", dict(bias="bias", c="c", gate=None, scale_a=None, scale_b=None, activation=Activation.NONE)),
    ("silu+gated", dict(bias=None, c=None, gate="c", scale_a=None, scale_b=None, activation=Activation.SILU)),
    ("fp8 rowcol", dict(bias=None, c=None, gate=None, scale_a="scale_a", scale_b="scale_b",
                        activation=Activation.NONE)),
])
def test_the_tuned_side_passes_the_operations_operands_to_matmul(monkeypatch, name, expected):
    problem = PROBLEMS[name]
    ops = _ops(problem)
    seen = {}

    def fake_matmul(a, b, table, out_dtype, **kwargs):
        seen.update(kwargs, a=a, b=b, out_dtype=out_dtype)
        return torch.empty(0)

    monkeypatch.setattr(_check, "matmul", fake_matmul)
    tuned_function(object(), problem)(ops)
    assert seen["a"] is not None and seen["a"].data_ptr() == ops.a_mk.data_ptr()
    assert seen["out_dtype"] == {DType.BF16: torch.bfloat16, DType.F16: torch.float16}[problem.dtype_d]
    for key, field in expected.items():
        if key == "activation":
            assert seen[key] is field
        else:
            assert seen[key] is (None if field is None else getattr(ops, field)), key

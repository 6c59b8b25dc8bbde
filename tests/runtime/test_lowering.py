"""The operators' Inductor lowerings on the CPU (runtime/_lowering.py): a compiled graph calls each
operator as an extern kernel writing into Inductor's buffer
(`cutlass_tune_extern.<op>_into_cpu(..., buf)`, the buffer last and positional), not through the
dispatcher, and computes what eager computes; `CUTLASS_TUNE_EXTERN=0` and the cases the lowering
leaves (no native library on CUDA, Inductor's C++ wrapper) keep the dispatcher's call; a graph
loaded from Inductor's cache in a fresh process finds its kernels, and one naming kernels of
another convention still runs. The CUDA kernels (the native library's `*_out`) are
tests/runtime/test_native_gpu.py's."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch._inductor.utils import run_and_get_code

from cutlass_tune.runtime import BestTable, _lowering, register_table

REPO = Path(__file__).resolve().parents[2]
OPS = torch.ops.cutlass_tune


@pytest.fixture(scope="module")
def key():
    return register_table(BestTable(pd.DataFrame()), key="test-lowering")


@pytest.fixture(autouse=True)
def _fresh_compile():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


def _compiled(fn, *args):
    with torch.no_grad():
        want = fn(*args)
        got, codes = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return want, got, "\n".join(codes)


def _calls(code: str) -> list[str]:
    return [line.strip() for line in code.splitlines() if "cutlass_tune" in line and not line.strip().startswith("#")]


def test_mm_and_linear_are_extern_kernels_writing_into_inductor_s_buffer(key):
    def step(a, w, bias, residual, gate):
        x = OPS.mm(a, w.t(), key)
        y = OPS.linear(torch.relu(x), w, bias, "gelu", key)
        z = OPS.linear(y, w, None, "none", key, residual=residual)
        return OPS.linear(z, w, bias, "silu", key, gate=gate) * 2

    torch.manual_seed(0)
    a, w, bias, residual, gate = (torch.randn(32, 64), torch.randn(64, 64), torch.randn(64), torch.randn(32, 64),
                                  torch.randn(32, 64))
    before = _lowering.lowered()
    want, got, code = _compiled(step, a, w, bias, residual, gate)
    torch.testing.assert_close(got, want)
    calls = _calls(code)
    assert calls[0] == "from cutlass_tune.runtime import _lowering as cutlass_tune_extern", calls
    # the schema's order: tensors from the graph, None for an absent optional tensor, the constants
    assert calls[1].startswith("cutlass_tune_extern.mm_into_cpu(") and calls[1].endswith("'test-lowering', None, buf0)")
    assert ", 'gelu', 'test-lowering', None, None, buf" in calls[2], calls
    assert ", None, 'none', 'test-lowering', arg3_1, None, buf" in calls[3], calls
    assert ", 'silu', 'test-lowering', None, arg4_1, buf" in calls[4], calls
    assert len(calls) == 5 and not any("torch.ops.cutlass_tune" in c or "assert_size_stride(buf" in c for c in calls)
    after = _lowering.lowered()
    assert after["mm"] - before.get("mm", 0) == 1 and after["linear"] - before.get("linear", 0) == 3


def test_scaled_and_grouped_gemms_are_extern_kernels(key):
    def step(x, w, w_scale, bias, experts, offs):
        scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-4) / 448.0
        xq = (x.float() / scale).to(torch.float8_e4m3fn)
        y = OPS.scaled_mm(xq, w.t(), scale, w_scale, None, key, torch.bfloat16)
        y = y + OPS.scaled_mm(xq, w.t(), scale, w_scale, bias, key, torch.bfloat16)
        return OPS.grouped_mm(y, experts, offs, key)

    torch.manual_seed(0)
    x, w = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(64, 64).to(torch.float8_e4m3fn)
    w_scale, bias = torch.rand(1, 64) + 0.5, torch.randn(64, dtype=torch.bfloat16)
    experts, offs = torch.randn(4, 64, 32, dtype=torch.bfloat16), torch.tensor([8, 16, 24, 32], dtype=torch.int32)
    want, got, code = _compiled(step, x, w, w_scale, bias, experts, offs)
    torch.testing.assert_close(got, want)
    calls = _calls(code)
    scaled = [c for c in calls if c.startswith("cutlass_tune_extern.scaled_mm_into_cpu(")]
    assert len(scaled) == 2 and ", None, 'test-lowering', torch.bfloat16, buf" in scaled[0], calls
    assert ", arg3_1, 'test-lowering', torch.bfloat16, buf" in scaled[1], calls
    grouped = [c for c in calls if c.startswith("cutlass_tune_extern.grouped_mm_into_cpu(")]
    assert len(grouped) == 1 and re.search(r", arg5_1, 'test-lowering', None, buf\d+\)$", grouped[0]), calls
    assert not any("torch.ops.cutlass_tune" in c for c in calls)


def test_a_compiled_backward_lowers_the_gradient_gemms_too(key):
    a = torch.randn(16, 32, requires_grad=True)
    w = torch.randn(24, 32, requires_grad=True)
    compiled = torch.compile(lambda a, w: OPS.mm(a, w.t(), key).square().sum())
    before = _lowering.lowered().get("mm", 0)
    compiled(a, w).backward()
    want_a, want_w = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    (a @ w.t()).square().sum().backward()
    torch.testing.assert_close(want_a, a.grad)
    torch.testing.assert_close(want_w, w.grad)
    assert _lowering.lowered()["mm"] - before >= 3  # the forward's and both gradients'


def test_the_cases_the_lowering_leaves_to_the_dispatcher():
    cpu = torch.empty(2, 3)
    assert _lowering._kernel_name("mm", cpu, cpp_wrapper=False) == "mm_into_cpu"
    assert _lowering._kernel_name("mm", cpu, cpp_wrapper=True) is None  # Inductor's C++ wrapper, AOTInductor
    assert _lowering._kernel_name("mm", torch.empty(2, 3, device="meta"), cpp_wrapper=False) is None
    assert _lowering._kernel_name("mm", None, cpp_wrapper=False) is None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _lowering.nothing  # noqa: B018


_FRESH = r"""
import sys, pandas as pd, torch
from torch._inductor.utils import run_and_get_code
from cutlass_tune.runtime import BestTable, _lowering, register_table
key = register_table(BestTable(pd.DataFrame()), key="fresh")
torch.manual_seed(0)
a, b = torch.randn(8, 16), torch.randn(16, 4)
with torch.no_grad():
    got, (code,) = run_and_get_code(torch.compile(lambda a, b: torch.ops.cutlass_tune.mm(a, b, key).relu()), a, b)
assert torch.allclose(got, (a @ b).relu())
print("EXTERN" if "cutlass_tune_extern.mm_into_cpu(" in code else "DISPATCHER" if "torch.ops.cutlass_tune.mm" in code
      else "NEITHER", _lowering.lowered().get("mm", 0))
"""


def _fresh(tmp_path, **env):
    done = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_extern_off_keeps_the_dispatcher_call(tmp_path):
    assert _fresh(tmp_path, CUTLASS_TUNE_EXTERN="0", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1") == ["DISPATCHER", "0"]


def test_extern_off_routes_a_cached_extern_graph_through_the_dispatcher(monkeypatch):
    """A graph from Inductor's cache calls `cutlass_tune_extern.mm_into`: the native out variant
    where the setting allows it, else the operator through the dispatcher."""
    def native(*args):
        raise AssertionError("not called")

    monkeypatch.setattr(_lowering, "_native_out", lambda name: native)  # as where the library is loaded
    for setting, kernel in (("1", native), ("0", "mm_into_cpu")):
        monkeypatch.setenv("CUTLASS_TUNE_EXTERN", setting)
        monkeypatch.delitem(_lowering.__dict__, "mm_into", raising=False)  # looked up anew, as in a fresh process
        got = _lowering.mm_into
        assert got is kernel if callable(kernel) else got.__name__ == kernel, (setting, got)
    monkeypatch.delitem(_lowering.__dict__, "mm_into")


def test_a_kernel_name_of_another_convention_runs_the_operator_through_the_dispatcher(key, monkeypatch):
    """A graph Inductor cached under another version of the package (its cache key does not see
    this one) may name `mm` with `out=`: it runs, through the dispatcher, and computes the same."""
    monkeypatch.setattr(_lowering, "_native_out", lambda name: None)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    for attr, call in (("mm", lambda k, out: k(a, b, key, None, out=out)),
                       ("mm_into", lambda k, out: k(a, b, key, None, out))):
        monkeypatch.delitem(_lowering.__dict__, attr, raising=False)
        out = torch.empty(8, 4)
        call(getattr(_lowering, attr), out)
        torch.testing.assert_close(out, a @ b)
        monkeypatch.delitem(_lowering.__dict__, attr)


def test_a_graph_from_inductor_s_cache_finds_its_kernels_in_a_fresh_process(tmp_path):
    assert _fresh(tmp_path) == ["EXTERN", "1"]  # compiled and lowered, written to the cache
    # the second process loads the graph from the cache (nothing lowered) and runs it right
    assert _fresh(tmp_path) == ["EXTERN", "0"]


def test_through_dispatcher_compiles_the_other_side_of_a_benchmark(key, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a cache of this test's graphs only
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch._inductor.config.patch(fx_graph_cache=True):
        with _lowering.through_dispatcher():
            _, _, inside = _compiled(lambda a, b: OPS.mm(a, b, key).relu(), a, b)
        torch._dynamo.reset()
        _, _, after = _compiled(lambda a, b: OPS.mm(a, b, key).relu(), a, b)
    assert "torch.ops.cutlass_tune.mm.default(" in inside and "cutlass_tune_extern" not in inside
    assert "cutlass_tune_extern.mm_into_cpu(" in after  # not served the graph compiled inside


def test_a_dynamic_batch_keeps_the_extern_kernel(key):
    """M symbolic (a compile for every batch size would not do): one graph, one extern call, and
    each size computes what eager computes."""
    w = torch.randn(64, 32)
    compiled = torch.compile(lambda a: OPS.mm(a, w.t(), key).relu(), dynamic=True, fullgraph=True)
    with torch.no_grad():
        for m in (8, 24, 40):
            a = torch.randn(m, 32)
            got, codes = run_and_get_code(compiled, a)
            torch.testing.assert_close(got, (a @ w.t()).relu())
    code = "\n".join(codes)
    assert "cutlass_tune_extern.mm_into_cpu(" in code and "torch.ops.cutlass_tune" not in code


def test_inductor_s_cpp_wrapper_keeps_the_dispatcher_call(key):
    """The C++ wrapper (and AOTInductor) cannot call a Python extern kernel: the lowering hands
    the call to Inductor's fallback, and the graph still computes what eager computes."""
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch._inductor.config.patch(cpp_wrapper=True):
        want, got, code = _compiled(lambda a, b: OPS.mm(a, b, key).relu(), a, b)
    torch.testing.assert_close(got, want)
    assert "cutlass_tune_extern" not in code


def test_the_moe_glu_stage_is_an_extern_kernel(key):
    """The MoE layer's GLU operator, defined in Python: its kernel is the one it registers
    (`register_kernel`), on the CPU the operator copied into the buffer."""
    from cutlass_tune.runtime._moe_glu import gate_up_glu_op

    torch.manual_seed(0)
    rows, gate_up = torch.randn(24, 32, dtype=torch.bfloat16), torch.randn(3, 2 * 16, 32, dtype=torch.bfloat16)
    offs = torch.tensor([8, 16, 24], dtype=torch.int32)
    want, got, code = _compiled(lambda r, w, o: gate_up_glu_op(r * 2, w, o, key, "silu", False, False) + 1,
                                rows, gate_up, offs)
    torch.testing.assert_close(got, want)
    calls = [c for c in _calls(code) if c.startswith("cutlass_tune_extern.")]
    assert len(calls) == 1 and calls[0].startswith("cutlass_tune_extern.moe_gate_up_glu_into_cpu(")
    assert re.search(r", arg1_1, arg2_1, 'test-lowering', 'silu', False, False, buf\d+\)$", calls[0]), calls


def test_the_glu_stage_s_cuda_kernel_is_the_library_s_where_it_has_one(monkeypatch):
    from cutlass_tune.runtime import _moe_glu, _native

    monkeypatch.setattr(_native, "door", None)
    assert _lowering._native_out("moe_gate_up_glu") is None  # the dispatcher's call: no library
    monkeypatch.setattr(_native, "door", type("Old", (), {})())
    assert _lowering._native_out("moe_gate_up_glu") is None  # a library without the GLU door's out variant
    monkeypatch.setattr(_native, "door", type("New", (), {"grouped_glu_out": staticmethod(lambda *a: None)})())
    assert _lowering._native_out("moe_gate_up_glu") is _moe_glu._gate_up_glu_into
    with pytest.raises(AssertionError):
        _lowering.register_kernel("no_such_operator", lambda: None)


_MOE_ROWS = r"""
import pandas as pd, torch
from torch._inductor.utils import run_and_get_code
from cutlass_tune.runtime import BestTable, _lowering, _moe_routing, register_table
from cutlass_tune.runtime._moe_routing import moe_combine, moe_gather, moe_routing
key = register_table(BestTable(pd.DataFrame()), key="rows")
a = torch.randn(8, 16)
with torch.no_grad():  # a first compile registers the lowerings the process has operators for
    torch.compile(lambda a: torch.ops.cutlass_tune.mm(a, a.t(), key))(a)
assert "moe_gather" not in _lowering._registered
# the CUDA build's MoE operators, defined later (as the library loads after the first compile), on the CPU
lib = torch.library.Library("cutlass_tune", "FRAGMENT")
lib.define("moe_gather(Tensor x, Tensor inv, Tensor? weights, int top_k) -> Tensor")
lib.define("moe_combine(Tensor y, Tensor inv, Tensor? weights, int top_k) -> Tensor")
lib.define("moe_weights_grad(Tensor a, Tensor b, Tensor inv, int top_k) -> Tensor")
def gather(x, inv, w, k):
    return _moe_routing._torch_gather(x, torch.empty_like(inv).scatter_(0, inv, torch.arange(inv.shape[0])), inv, w, k)
lib.impl("moe_gather", gather, "CPU")
lib.impl("moe_combine", lambda y, inv, w, k: _moe_routing._torch_combine(y, None, inv, w, k), "CPU")
lib.impl("moe_weights_grad", _moe_routing._torch_weights_grad, "CPU")
assert _moe_routing.register_native()
_moe_routing._native_op = lambda name, t, weights=None: _moe_routing._native.get(name)  # CPU tensors take them
torch.manual_seed(0)
index = torch.stack([torch.randperm(6)[:2] for _ in range(8)])
weights = torch.rand(8, 2)
def layer(x, index, weights):
    r = moe_routing(index, 6)
    return moe_combine(moe_gather(x, r) * 3, r, weights)
with torch.no_grad():
    want = layer(a, index, weights)
    got, (code,) = run_and_get_code(torch.compile(layer, fullgraph=True), a, index, weights)
torch.testing.assert_close(got, want)
calls = [line.strip().split("(")[0] for line in code.splitlines() if "cutlass_tune_extern." in line]
print(" ".join(calls), "dispatcher" if "torch.ops.cutlass_tune" in code else "-")
"""


def test_moe_gather_and_combine_are_extern_kernels_where_the_library_defines_them():
    """Operators defined after the first registration (the CUDA build's MoE glue, here stand-ins
    on the CPU under the same names) get their lowerings from their own fakes, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _MOE_ROWS], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["cutlass_tune_extern.moe_gather_into_cpu",
                                   "cutlass_tune_extern.moe_combine_into_cpu", "-"]

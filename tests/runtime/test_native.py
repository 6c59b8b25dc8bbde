"""The operators' native library (runtime/_native.py, cutlass_tune/native/): the C++ mirror of the
kernels' argument struct, the Python path kept (with one warning) where the library cannot be
loaded, and (nvcc mark: one g++ run of about a minute against the installed CPU torch) the real
build loaded in a fresh process: schemas, CPU results, fake shapes, autograd, torch.compile.
tests/runtime/test_native_gpu.py runs it on CUDA."""

import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cutlass_tune.kernel import GemmArgs
from cutlass_tune.kernel._native import LIBRARY, cached_builds, native_key
from cutlass_tune.runtime import _dispatch, _native, _table

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "cutlass_tune" / "native" / "cutlass_tune_args.h"
UNIT = REPO / "templates" / "gemm_sm90_unit.cu.j2"
_C_TYPES = {"int64_t": "c_long", "int32_t": "c_int", "float": "c_float", "const void*": "c_void_p",
            "void*": "c_void_p"}


def _struct_fields(text: str) -> list[tuple[str, str]]:
    """(C type, name) of each field of `struct cutlass_tune_args` in `text`, comments dropped."""
    body = re.search(r"struct cutlass_tune_args \{(.*?)\};", text, re.S).group(1)
    fields = []
    for line in re.sub(r"//[^\n]*", "", body).split(";"):
        line = line.strip()
        if line:
            kind, names = re.match(r"((?:const )?\w+\*?)\s+(.*)", line).groups()
            fields += [(kind, name.strip()) for name in names.split(",")]
    return fields


def test_the_native_header_mirrors_the_kernels_struct_and_gemm_args():
    """Guards the C++ launcher against filling a struct the kernels read otherwise."""
    header, unit = _struct_fields(HEADER.read_text()), _struct_fields(UNIT.read_text())
    assert header == unit
    assert [(_C_TYPES[kind], name) for kind, name in header] == \
        [(getattr(t, "__name__", str(t)).replace("c_longlong", "c_long"), name) for name, t in GemmArgs._fields_]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """`_native` as before its first load, the kernel cache in `tmp_path`, no warning said yet."""
    monkeypatch.setenv("CUTLASS_TUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTLASS_TUNE_NATIVE", raising=False)  # the suite's guard sets it to 0
    monkeypatch.setattr(_native, "_tried", False)
    monkeypatch.setattr(_native, "_module", None)
    monkeypatch.setattr(_native, "door", None)
    monkeypatch.setattr(_native, "_why", None)
    monkeypatch.setattr(_native, "_bundles", [])
    # the bundles earlier tests loaded (BestTable.load remembers each for the loader) hold libraries
    monkeypatch.setattr(_table, "NATIVE_BUNDLES", [])
    monkeypatch.setattr(_dispatch, "_warned", set())
    return cached_builds(tmp_path)


def _load():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = _native.load()
    return module, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_library_never_built_leaves_the_python_path_silently(fresh):
    module, said = _load()
    assert module is None and said == [] and "not built" in _native.reason()
    assert not _native.available()


def test_disabled_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_NATIVE", "0")
    assert _load() == (None, []) and "CUTLASS_TUNE_NATIVE=0" in _native.reason()


def _planted(folder: Path, content: bytes, digest_of: bytes | None = None) -> Path:
    import hashlib

    build = folder / native_key()
    build.mkdir(parents=True)
    (build / LIBRARY).write_bytes(content)
    recorded = content if digest_of is None else digest_of
    (build / "library.json").write_text(json.dumps({"bytes": len(recorded),
                                                    "sha256": hashlib.sha256(recorded).hexdigest()}))
    return build / LIBRARY


def test_a_damaged_library_is_refused_with_one_warning(fresh):
    """Guards against loading a library changed after its build (never dlopen'd)."""
    _planted(fresh, b"\x7fELF truncated", digest_of=b"\x7fELF the library that was built")
    module, said = _load()
    assert module is None and len(said) == 1 and "not the library that was built" in said[0]
    assert "Python path" in said[0]
    assert _load() == (None, [])  # once


def test_a_recorded_build_failure_says_its_reason(fresh):
    fresh.mkdir(parents=True)
    (fresh / f"{native_key()}.failed.json").write_text(json.dumps({"reason": "ops.cpp:3: error: boom"}))
    module, said = _load()
    assert module is None and len(said) == 1 and "ops.cpp:3: error: boom" in said[0]


def test_a_library_is_never_loaded_over_operators_python_defined(fresh, monkeypatch):
    """Guards the process: defining the operators a second time from a library's initializer aborts it."""
    from cutlass_tune.runtime import _op  # noqa: F401  (defines them in Python: no library was there)

    monkeypatch.setattr(_native, "_tried", False)

    _planted(fresh, b"\x7fELF not even an ELF library")
    module, said = _load()
    assert module is None and "defined in Python before" in said[0]


def test_a_file_that_is_not_the_extension_is_refused_before_dlopen(fresh, monkeypatch):
    from tests.compile.fake_nvcc import elf_library

    monkeypatch.setattr(_native, "_defined", lambda qualname: False)
    _planted(fresh, elf_library())  # an ELF library, its digest right, without the module's PyInit
    module, said = _load()
    assert module is None and "refused" in said[0] and "PyInit_cutlass_tune_native" in said[0]


# ---------------------------------------------------------------------------------------------
# The real build (g++ against the installed torch), loaded in a fresh process


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from cutlass_tune.compile import KernelCache
    from cutlass_tune.compile._native import build_native

    root = tmp_path_factory.mktemp("native-cache")
    found = build_native(cache=KernelCache(root), retry=True)
    assert found.library is not None, found.reason
    return root


PROBE = r"""
import json, torch, warnings
from cutlass_tune.kernel import GemmArgs
from cutlass_tune.runtime import _native, _op, _grouped_op, register_table
from cutlass_tune.runtime._table import BestTable
import pandas as pd
out = {"available": _native.available(), "reason": _native.reason(), "cuda": _native.cuda()}
out["layout"] = _native._module.args_layout()
out["gemm_args"] = {name: getattr(GemmArgs, name).offset for name, _ in GemmArgs._fields_}
out["gemm_args"]["sizeof"] = __import__("ctypes").sizeof(GemmArgs)
out["schemas"] = {n: str(getattr(torch.ops.cutlass_tune, n).default._schema)
                  for n in ("mm", "linear", "grouped_mm", "scaled_mm")}
out["scaled_is_native"] = _op.scaled_mm_op is torch.ops.cutlass_tune.scaled_mm.default
out["out_variants"] = {n: getattr(_native._module, n + "_out").__doc__.splitlines()[0]
                       for n in ("mm", "linear", "grouped_mm", "scaled_mm")}
out["mm_is_native"] = _op.mm is torch.ops.cutlass_tune.mm.default
register_table(BestTable(pd.DataFrame(columns=["m", "n", "k", "gpu", "config_hash", "config", "dtype_a", "dtype_d",
                                               "layout", "epilogue", "scaling"])), "k")
torch.manual_seed(0)
a = torch.randn(2, 4, 8, requires_grad=True); b = torch.randn(8, 3, requires_grad=True)
y = torch.ops.cutlass_tune.mm(a, b, "k")
out["mm"] = torch.allclose(y, a @ b)
out["grad_fn"] = y.grad_fn.name()
y.square().sum().backward()
a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
(a2 @ b2).square().sum().backward()
out["mm_grads"] = torch.allclose(a.grad, a2.grad, atol=1e-5) and torch.allclose(b.grad, b2.grad, atol=1e-5)
with torch.no_grad():
    out["no_grad_has_no_grad_fn"] = torch.ops.cutlass_tune.mm(a, b, "k").grad_fn is None
x = torch.randn(5, 8, requires_grad=True); w = torch.randn(6, 8, requires_grad=True); bias = torch.randn(6)
r = torch.randn(5, 6)
y = torch.ops.cutlass_tune.linear(x, w, bias, "gelu", "k", r)
out["linear"] = torch.allclose(y, torch.nn.functional.gelu(x @ w.t() + bias + r), atol=1e-5)
y.sum().backward()
out["linear_grads"] = x.grad is not None and w.grad is not None
A = torch.randn(6, 16, dtype=torch.bfloat16, requires_grad=True)
B = torch.randn(2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
offs = torch.tensor([2, 6], dtype=torch.int32)
y = torch.ops.cutlass_tune.grouped_mm(A, B, offs, "k")
want = torch.cat([A[:2] @ B[0], A[2:] @ B[1]])
out["grouped"] = torch.allclose(y.float(), want.float(), atol=1e-2)
y.float().sum().backward()
out["grouped_grads"] = list(A.grad.shape) + list(B.grad.shape)
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    out["fake"] = list(torch.ops.cutlass_tune.grouped_mm(torch.empty(7, 16, dtype=torch.bfloat16),
                       torch.empty(2, 16, 8, dtype=torch.bfloat16), torch.empty(2, dtype=torch.int32), "k",
                       torch.float32).shape)
compiled = torch.compile(lambda a, b: torch.ops.cutlass_tune.mm(a, b, "k").relu(), fullgraph=True)
out["compiled"] = torch.allclose(compiled(a.detach(), b.detach()), (a @ b).relu().detach())
out["hook_calls"] = _native._module.hook_calls()
try:
    torch.ops.cutlass_tune.mm(a, b, "missing")
except Exception as err:
    out["unregistered"] = type(err).__name__
print(json.dumps(out))
"""


@pytest.mark.nvcc
def test_the_built_library_defines_the_operators_in_a_fresh_process(built):
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "CUTLASS_TUNE_CACHE_DIR": str(built)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["available"] and out["reason"] is None and out["mm_is_native"], out
    assert out["layout"] == out["gemm_args"]  # the C++ struct's offsets are GemmArgs'
    assert out["schemas"] == {
        "mm": "cutlass_tune::mm(Tensor a, Tensor b, str table, ScalarType? out_dtype=None) -> Tensor",
        "linear": "cutlass_tune::linear(Tensor x, Tensor weight, Tensor? bias, str activation, str table, "
                  "Tensor? residual=None, Tensor? gate=None) -> Tensor",
        "grouped_mm": "cutlass_tune::grouped_mm(Tensor a, Tensor b, Tensor offs, str table, "
                      "ScalarType? out_dtype=None) -> Tensor",
        "scaled_mm": "cutlass_tune::scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
                     "str table, ScalarType out_dtype) -> Tensor"}
    assert out["scaled_is_native"]
    # Inductor's extern kernels (runtime/_lowering.py) pass the operator's arguments in the schema's
    # order, then the buffer, all positional: each out variant takes exactly those, none keyword-only
    for name, doc in out["out_variants"].items():
        params = re.match(rf"{name}_out\((.*)\) -> None", doc)
        assert params and "*" not in params.group(1), doc
        schema = re.search(r"\((.*)\)", out["schemas"][name]).group(1)
        want = [arg.split("=")[0].split()[-1] for arg in schema.split(", ")] + ["out"]
        assert [p.split(":")[0] for p in params.group(1).split(", ")] == want, doc
    assert out["mm"] and out["mm_grads"] and out["no_grad_has_no_grad_fn"]
    assert out["grad_fn"].endswith("<cutlass_tune_native::MmFunction>")  # the C++ autograd Function
    assert out["hook_calls"]["autograd"] == 0  # every gradient above came without the Python formula
    assert out["linear"] and out["linear_grads"] and out["grouped"] and out["compiled"]
    assert out["grouped_grads"] == [6, 16, 2, 16, 8] and out["fake"] == [7, 8]
    assert out["unregistered"] == "UnregisteredTableError"


GRADS_PROBE = r"""
import itertools, json, torch
import torch.nn.functional as F
import pandas as pd
from cutlass_tune.runtime import _native, _op, _grouped_op, register_table
from cutlass_tune.runtime._table import BestTable
register_table(BestTable(pd.DataFrame(columns=["m", "n", "k", "gpu", "config_hash", "config", "dtype_a", "dtype_d",
                                               "layout", "epilogue", "scaling"])), "k")
torch.manual_seed(0)
ACT = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
       "silu": F.silu}
bad = []

def run(fn, ts):
    ts = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in ts]
    y = fn(*ts)
    y.square().sum().backward()
    return [y.detach()] + [None if t is None or not t.requires_grad else t.grad for t in ts]

def compare(name, ours, ref, *ts):
    for i, (u, v) in enumerate(zip(run(ours, ts), run(ref, ts))):
        if (u is None) != (v is None) or (u is not None and not torch.allclose(u, v, atol=1e-4, rtol=1e-4)):
            bad.append(f"{name} #{i}")

mm = lambda a, b: torch.ops.cutlass_tune.mm(a, b, "k")
a = torch.randn(2, 4, 8, requires_grad=True)
compare("mm", mm, torch.matmul, a, torch.randn(8, 3, requires_grad=True))
compare("mm tn", mm, torch.matmul, a, torch.randn(3, 8).t().requires_grad_())
compare("mm nt", mm, torch.matmul, torch.randn(8, 4).t().requires_grad_(), torch.randn(8, 3))
for act, has_bias, extra in itertools.product(ACT, (True, False), ("none", "residual", "gate")):
    c = torch.randn(2, 5, 6, requires_grad=True)
    r, g = (c if extra == "residual" else None), (c if extra == "gate" else None)
    bias = torch.randn(6, requires_grad=True) if has_bias else None

    def ours(x, w, bias, r, g):
        return torch.ops.cutlass_tune.linear(x, w, bias, act, "k", r, g)

    def ref(x, w, bias, r, g):
        z = x @ w.t() + (0 if bias is None else bias)
        return ACT[act](g) * z if g is not None else ACT[act](z + (0 if r is None else r))

    compare(f"linear {act} {has_bias} {extra}", ours, ref, torch.randn(2, 5, 8, requires_grad=True),
            torch.randn(6, 8, requires_grad=True), bias, r, g)
offs = torch.tensor([2, 6], dtype=torch.int32)
for name, B in (("kn", torch.randn(2, 16, 8, requires_grad=True)),
                ("weights", torch.randn(2, 8, 16).transpose(-2, -1).requires_grad_())):
    compare(f"grouped {name}", lambda A, B: torch.ops.cutlass_tune.grouped_mm(A, B, offs, "k"),
            lambda A, B: torch.cat([A[:2] @ B[0], A[2:] @ B[1]]), torch.randn(6, 16, requires_grad=True), B)
calls = _native._module.hook_calls()
from cutlass_tune.runtime import MatmulInputError
table = _op.registered_table("k")
doors = []
for call in (lambda: _native._module.matmul(torch.ones(8, 8), torch.ones(8, 8), _native.door_key(table), None,
                                            None, None, 1.0),
             lambda: _native._module.grouped_mm(torch.ones(8, 8), torch.ones(2, 8, 8),
                                                torch.tensor([4, 8], dtype=torch.int32), _native.door_key(table),
                                                torch.float32, True, 0.0)):
    try:
        call()
        doors.append("no error")
    except MatmulInputError as err:
        doors.append(str(err))
door_calls = _native._module.hook_calls()["door"] - calls["door"]
print(json.dumps({"bad": bad, "hook_calls": calls, "doors": doors, "door_calls": door_calls}))
"""


@pytest.mark.nvcc
def test_the_cpp_autograd_functions_give_torch_s_gradients(built):
    """Guards the C++ backward of mm, linear (every activation, bias, residual, gate) and grouped_mm
    against drifting from the Python formula it replaced: gradients equal torch autograd's own."""
    done = subprocess.run([sys.executable, "-c", GRADS_PROBE], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "CUTLASS_TUNE_CACHE_DIR": str(built)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["bad"] == []
    assert out["hook_calls"]["autograd"] == 0
    # the function doors' C++ entry points hand CPU tensors to the Python doors, which refuse them
    assert out["door_calls"] == 2 and all("cuda" in said.lower() for said in out["doors"]), out["doors"]


@pytest.mark.nvcc
def test_the_operators_cpu_tests_pass_on_the_native_library(built):
    """The Python path's tests of the operators (schemas, opcheck, fake tensors, gradients,
    torch.compile, the checks; the fp8 Linear's scaled operator) run again with the operators the
    library's."""
    env = {**os.environ, "CUTLASS_TUNE_CACHE_DIR": str(built), "CUTLASS_TUNE_NATIVE": "1"}
    check = "from cutlass_tune.runtime import _native, _op, _grouped_op; assert _native.available(), _native.reason()"
    subprocess.run([sys.executable, "-c", check], check=True, cwd=REPO, env=env)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                           "not nvcc and not postgresql and not gpu", "tests/runtime/test_op.py",
                           "tests/runtime/test_grouped.py", "tests/runtime/test_grouped_launch.py",
                           "tests/runtime/test_fp8_linear.py"],
                          capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.nvcc
def test_the_cli_says_where_it_is_and_that_it_loads(built):
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "native", "--cache-dir", str(built)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("key: ") for line in lines)
    assert any(line.startswith("library: ") and line.endswith(LIBRARY) for line in lines)
    assert "loads: yes (CUDA kernels none: a CPU torch)" in lines


def test_a_bundle_carries_the_library_and_a_loaded_bundle_is_searched(fresh, tmp_path, monkeypatch):
    """Guards a serving host without a compiler: the bundle's copy of its torch's build is found."""
    from cutlass_tune.report import load_best, write_bundle
    from cutlass_tune.runtime import BestTable, _op, _table
    from tests.report.test_bundle import BUILT_WITH, stand_ins
    from tests.test_imports import STORE

    build = _planted(tmp_path / "elsewhere", b"\x7fELF the build of another cache")
    frame = load_best(STORE)
    write_bundle(frame, stand_ins(frame, tmp_path / "units"), tmp_path / "bundle", BUILT_WITH, native=[build.parent])
    carried = tmp_path / "bundle" / "native" / native_key() / LIBRARY
    assert carried.read_bytes() == build.read_bytes()
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["native"] == [native_key()]
    _table.NATIVE_BUNDLES.clear()
    del _op  # imported: the operators are Python's in this process
    monkeypatch.setattr(_native, "_tried", False)
    BestTable.load(tmp_path / "bundle")
    assert _table.NATIVE_BUNDLES == [tmp_path / "bundle"]
    module, said = _load()  # found in the bundle (and refused there: these operators are Python's already)
    assert module is None and "defined in Python before" in _native.reason()
    _table.NATIVE_BUNDLES.clear()


def test_the_cli_says_a_library_is_not_built_and_a_failed_build_s_reason(tmp_path):
    def native(*args):
        return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "native", "--cache-dir", str(tmp_path),
                               *args], capture_output=True, text=True, cwd=REPO)

    done = native()
    assert done.returncode == 0 and "library: not built (cutlass-tune native --build)" in done.stdout.splitlines()
    failed = cached_builds(tmp_path)  # made by the first run
    (failed / f"{native_key()}.failed.json").write_text(json.dumps({"reason": "ops.cpp:3: error: boom"}))
    done = native()
    assert done.returncode == 1 and "library: none: its build failed: ops.cpp:3: error: boom" in done.stdout


# ---------------------------------------------------------------------------------------------
# The function doors' native path (a recording stand-in for the library's CUDA build)


class _RecordingDoor:
    """What `_native.door` is on a CUDA host, recording its calls and answering a tensor."""

    def __init__(self):
        self.calls, self.forgotten, self.bound = [], [], []

    def matmul(self, *args):
        self.calls.append(("matmul", *args))
        return "native"

    def grouped_mm(self, *args):
        self.calls.append(("grouped_mm", *args))
        return "native"

    def forget(self, key):
        self.forgotten.append(key)

    def bind(self, key, plans):
        self.bound.append((key, plans))


@pytest.fixture
def door(monkeypatch):
    # The operators first, with the library as it is: importing them attaches their Python parts to it.
    importlib.import_module("cutlass_tune.runtime._grouped_op")
    recording = _RecordingDoor()
    monkeypatch.setattr(_native, "door", recording)
    monkeypatch.setattr(_native, "_module", recording)
    return recording


def _empty_table():
    import pandas as pd

    from cutlass_tune.runtime import BestTable

    return BestTable(pd.DataFrame({"m": [1], "n": [1], "k": [1]}))


def test_matmul_without_an_epilogue_takes_the_native_door_once_per_table_key(door):
    import torch

    from cutlass_tune.runtime import grouped_mm, matmul

    table, other = _empty_table(), _empty_table()
    a, b, offs = torch.ones(8, 8), torch.ones(8, 8), torch.ones(2, dtype=torch.int32)
    assert matmul(a, b, table) == "native" and matmul(a, b, table, torch.float32, min_ratio=0) == "native"
    assert grouped_mm(a, torch.ones(2, 8, 8), offs, table=table, keep_workspace=False) == "native"
    matmul(a, b, other)
    keys = [call[3] if call[0] == "matmul" else call[4] for call in door.calls]
    assert keys[0] == keys[1] == keys[2] != keys[3]  # one key per table, not per call
    assert door.calls[1][4:] == (torch.float32, None, None, 0) and door.calls[2][5:] == (None, False, 1.0)
    assert _native.door_table(keys[0]) is table
    table.plans.clear()  # the table's plans dropped: the library's copies too
    assert door.forgotten == [keys[0], keys[0] + "/operators"]


def test_matmul_with_an_epilogue_or_bad_operands_keeps_the_python_door(door):
    """Guards the door's errors: what the native path cannot check first goes the Python way."""
    import torch

    from cutlass_tune.runtime import MatmulInputError, grouped_mm, matmul

    table = _empty_table()
    with pytest.raises(MatmulInputError, match="must be a torch.Tensor"):
        matmul([[1.0]], torch.ones(1, 1), table)
    with pytest.raises(MatmulInputError, match="offs must be a torch.Tensor"):
        grouped_mm(torch.ones(2, 8), torch.ones(2, 8, 8), [1, 2], table=table)
    with pytest.raises(MatmulInputError):  # CPU tensors: the Python door says they must be on CUDA
        matmul(torch.ones(8, 8), torch.ones(8, 8), table, bias=torch.ones(8))
    with pytest.raises(MatmulInputError):  # block-wise scales: expanded for the kernel in Python
        matmul(torch.ones(8, 256), torch.ones(256, 8), table, scale_a=torch.ones(8, 2), scale_b=torch.ones(2, 1))
    assert door.calls == []


def test_a_table_key_rebound_finds_each_table_s_own_plans_again(door):
    """register_table binds an operator key to the table's plan set (not a fresh one each time):
    a key bound to one table, another and the first again (tune-model's A/B) resolves nothing
    twice; the set is the table's, beside its doors' and forgotten with them."""
    from cutlass_tune.runtime import register_table

    first, second = _empty_table(), _empty_table()
    for table in (first, second, first):
        register_table(table, key="ab")
    register_table(first, key="other")
    sets = [plans for _, plans in door.bound]
    assert [key for key, _ in door.bound] == ["ab", "ab", "ab", "other"]
    assert sets[0] == sets[2] == sets[3] != sets[1]
    assert sets[0] == _native.door_key(first) + "/operators" != _native.door_key(first)
    assert door.forgotten == []  # rebinding drops no plans
    first.plans.clear()
    assert door.forgotten == [_native.door_key(first), sets[0]]


def test_a_door_key_is_forgotten_with_its_table(door):
    import gc

    table = _empty_table()
    key = _native.door_key(table)
    assert _native.door_key(table) == key and key.startswith("door-")
    del table
    gc.collect()
    assert key in door.forgotten and key not in _native._door_tables


def test_the_doors_take_the_native_path_for_defaults_given_as_other_objects(door):
    """Guards the doors' fast tests (by identity): equal values, subclasses and a table's later
    calls take the native path as the defaults do."""
    import torch

    from cutlass_tune.runtime import _matmul, grouped_mm, matmul

    table = _empty_table()
    a, b, offs = torch.ones(8, 8), torch.nn.Parameter(torch.ones(8, 8)), torch.ones(2, dtype=torch.int32)
    matmul(a, b, table, alpha=1, activation=_matmul.Activation.NONE.value, min_ratio=1)
    matmul(a, b, table, min_ratio=float("1"))
    grouped_mm(a, torch.nn.Parameter(torch.ones(2, 8, 8)), offs, table=table, activation="none", min_ratio=1,
               keep_workspace=1)
    assert [call[0] for call in door.calls] == ["matmul", "matmul", "grouped_mm"]
    assert door.calls[0][7] == 1 and type(door.calls[0][7]) is int and door.calls[2][6] is True
    assert len({door.calls[0][3], door.calls[1][3], door.calls[2][4]}) == 1  # the table's one key, read back


@pytest.mark.parametrize("epilogue", [{"bias": "t"}, {"c": "t"}, {"gate": "t"}, {"beta": 1.0}, {"alpha": 2.0},
                                      {"activation": "relu"}, {"scale_a": "t", "scale_b": "t", "block": True}])
def test_matmul_with_any_argument_off_its_default_keeps_the_python_door(door, epilogue):
    """Guards the fast test of the plain call: one argument off its default goes the Python way."""
    import torch

    from cutlass_tune.runtime import MatmulInputError, matmul

    kwargs = {name: torch.ones(8, 8) if value == "t" else value for name, value in epilogue.items() if name != "block"}
    if "block" in epilogue:  # block-wise scales: M x K/128 and K/128 x N/128
        kwargs = {"scale_a": torch.ones(8, 2), "scale_b": torch.ones(2, 1)}
    with pytest.raises(MatmulInputError):  # CPU tensors: the Python door says they must be on CUDA
        matmul(torch.ones(8, 256), torch.ones(256, 8), _empty_table(), **kwargs)
    assert door.calls == []


def test_the_doors_keep_the_python_path_under_the_profiler(door):
    """Guards the profiler test: tune-model reads each problem's kernel time from the Python door's range."""
    import torch

    from cutlass_tune.runtime import MatmulInputError, grouped_mm, matmul

    with torch.autograd.profiler.profile(), pytest.raises(MatmulInputError):
        matmul(torch.ones(8, 8), torch.ones(8, 8), _empty_table())
    with torch.autograd.profiler.profile(), pytest.raises(MatmulInputError):
        grouped_mm(torch.ones(2, 8), torch.ones(2, 8, 8), torch.ones(2, dtype=torch.int32), table=_empty_table())
    assert door.calls == []


@pytest.mark.parametrize("door", ["matmul", "grouped_mm"])
def test_a_door_alone_loads_the_native_library(tmp_path, door):
    """Guards the doors' native path: the library loaded only with the operators' import, so a script
    calling `cutlass_tune.matmul` alone ran the Python door (fp8 row-wise measured 7 us a call slower)."""
    import os
    import subprocess
    import sys

    code = ("import cutlass_tune; cutlass_tune." + door + "\n"
            "from cutlass_tune.runtime import _native\n"
            "print(_native._tried)")
    env = {**os.environ, "CUTLASS_TUNE_CACHE_DIR": str(tmp_path), "CUTLASS_TUNE_NATIVE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"]  # tried (none is built here) before any operator is used


def test_a_key_held_to_a_min_ratio_has_a_plan_set_of_its_own_forgotten_with_the_table(door):
    """`matmul` traced by torch.compile runs `mm` on a key held to its min_ratio: that key's plans
    are apart from the table's other operator plans (a signature may be a kernel at 0.0 and torch
    at 1.0) and are dropped when the table's plans are."""
    table = _empty_table()
    _native.bind("plain", table)
    _native.bind("held", table, 1.0)
    (_, plain), (_, held) = door.bound
    assert plain.endswith("/operators") and held == plain + "@min_ratio=1.0"
    table.plans.clear()
    assert door.forgotten == [plain.removesuffix("/operators"), plain, held]

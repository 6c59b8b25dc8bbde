import ctypes
import re
import shutil
import subprocess

import pytest

from cutlass_tune import render
from cutlass_tune.runtime import GemmArgs, KernelLoadError, LoadedKernel, cutlass_status_name, make_args
from cutlass_tune.space import Decomposition, Problem, RasterOrder, RuntimeArgs, smem_usage

from ..bench.abi import header_text

FIELDS = ["m", "n", "k", "a", "b", "c", "d", "alpha", "beta", "raster", "swizzle", "splits",
          "decomposition", "device_id", "sm_count", "bias", "scale_a", "scale_b"]
OFFSETS = [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68, 72, 76, 80, 84, 88, 96, 104]


def test_struct_has_the_natural_c_layout():
    assert [name for name, _ in GemmArgs._fields_] == FIELDS
    assert [getattr(GemmArgs, name).offset for name in FIELDS] == OFFSETS
    assert ctypes.sizeof(GemmArgs) == 112


def test_struct_mirrors_the_template_field_by_field():
    c_types = {"int64_t": ctypes.c_int64, "const void*": ctypes.c_void_p, "void*": ctypes.c_void_p,
               "float": ctypes.c_float, "int32_t": ctypes.c_int32}
    body = re.search(r"struct cutlass_tune_args \{(.*?)\};", header_text(), re.S).group(1)
    declared = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip().rstrip(";")
        if decl:
            ctype, names = re.match(r"(const void\*|void\*|\w+)\s+(.*)", decl).groups()
            declared += [(n.strip(), c_types[ctype]) for n in names.split(",")]
    assert declared == [(name, kind) for name, kind in GemmArgs._fields_]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_offsets_match_what_a_cpp_compiler_computes(tmp_path):
    prints = "".join(f'  std::printf("%zu ", offsetof(cutlass_tune_args, {f}));\n' for f in FIELDS)
    (tmp_path / "layout.cpp").write_text(
        header_text() + "#include <cstddef>\n#include <cstdio>\nint main() {\n" + prints
        + '  std::printf("%zu\\n", sizeof(cutlass_tune_args));\n}\n')
    subprocess.run(["g++", "-o", tmp_path / "layout", tmp_path / "layout.cpp"], check=True)
    printed = subprocess.run([tmp_path / "layout"], capture_output=True, text=True, check=True).stdout
    assert [int(x) for x in printed.split()] == OFFSETS + [ctypes.sizeof(GemmArgs)]


def test_make_args_sets_c_to_d_and_beta_zero():
    p = Problem(256, 512, 1024)
    r = RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=4, splits=2, decomposition=Decomposition.SPLIT_K)
    args = make_args(p, r, a=0x1000, b=0x2000, d=0x3000, device_id=1, sm_count=132)
    assert (args.m, args.n, args.k, args.a, args.b, args.c, args.d) == (256, 512, 1024, 0x1000, 0x2000, 0x3000, 0x3000)
    assert (args.alpha, args.beta) == (1.0, 0.0)
    assert (args.raster, args.swizzle, args.splits, args.decomposition) == (2, 4, 2, 2)
    assert (args.device_id, args.sm_count) == (1, 132)


def test_status_names():
    assert cutlass_status_name(0) == "kSuccess"
    assert cutlass_status_name(1) == "kErrorMisalignedOperand"
    assert cutlass_status_name(7) == "kErrorInternal"
    assert cutlass_status_name(42) == "status 42"


def test_missing_library_is_a_load_error(tmp_path):
    with pytest.raises(KernelLoadError, match="cannot load"):
        LoadedKernel(tmp_path / "nope.so", "ct_x")


# Loading and the host-only entry points need no GPU: the CUDA runtime is linked statically
# and starts the driver only on the first device call.

@pytest.mark.nvcc
def test_faulty_library_loads_and_its_host_entry_points_work(faulty_library):
    kernel = LoadedKernel(faulty_library, "ct_corrupt")
    args = make_args(Problem(128, 128, 128), RuntimeArgs(), a=16, b=32, d=48, device_id=0, sm_count=1)
    assert kernel.workspace_size(args) == 0
    assert kernel.can_implement(args) == 0
    with kernel.create() as gemm:
        gemm.initialize(args, None, 0)  # these kernels only copy the arguments


@pytest.mark.nvcc
def test_missing_symbol_and_abi_mismatch_are_load_errors(faulty_library, monkeypatch):
    with pytest.raises(KernelLoadError, match="does not export ct_nothing_"):
        LoadedKernel(faulty_library, "ct_nothing")
    monkeypatch.setattr(render, "ABI_VERSION", render.ABI_VERSION + 1)
    with pytest.raises(KernelLoadError, match="ABI version"):
        LoadedKernel(faulty_library, "ct_fault")


@pytest.mark.nvcc
def test_real_kernel_reports_stages_and_checks_alignment(cooperative_kernel):
    kernel = LoadedKernel(cooperative_kernel.library, cooperative_kernel.symbol)
    assert kernel.stages() == smem_usage(cooperative_kernel.config).stages
    assert 0 < kernel.shared_storage_bytes() <= 232448

    def can_implement(m, n, k):
        # Host-side checks only; the addresses are never dereferenced.
        return kernel.can_implement(make_args(Problem(m, n, k), RuntimeArgs(), a=1 << 20, b=2 << 20,
                                              d=3 << 20, device_id=0, sm_count=132))

    assert can_implement(4096, 4096, 4096) == 0
    assert can_implement(4096, 4096, 4100) != 0  # K not a multiple of 8 bf16 elements
    args = make_args(Problem(4096, 4096, 4096), RuntimeArgs(), a=1 << 20, b=2 << 20, d=3 << 20,
                     device_id=0, sm_count=132)
    assert kernel.workspace_size(args) == 0  # persistent scheduler, plain epilogue

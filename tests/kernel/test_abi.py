"""The ABI as ctypes declares it mirrors the C the templates write (tests/bench/abi.py cuts it out)."""

import ctypes
import re
import shutil
import subprocess

import pytest

from cutlass_tune.kernel import ENTRY_POINTS, GemmArgs, _abi, cutlass_status_name, make_args
from cutlass_tune.space import Decomposition, Problem, RasterOrder, RuntimeArgs

from ..bench.abi import REPO, header_text

FIELDS = ["m", "n", "k", "a", "b", "c", "d", "alpha", "beta", "raster", "swizzle", "splits",
          "decomposition", "device_id", "sm_count", "bias", "scale_a", "scale_b", "groups", "offsets"]
OFFSETS = [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68, 72, 76, 80, 84, 88, 96, 104, 112, 120]


def test_struct_has_the_natural_c_layout():
    assert [name for name, _ in GemmArgs._fields_] == FIELDS
    assert [getattr(GemmArgs, name).offset for name in FIELDS] == OFFSETS
    assert ctypes.sizeof(GemmArgs) == 128


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


def test_entry_points_mirror_the_template_function_by_function():
    c_types = {"int": ctypes.c_int, "size_t": ctypes.c_size_t, "void": None, "void*": ctypes.c_void_p,
               "const cutlass_tune_args*": ctypes.POINTER(GemmArgs)}
    text = (REPO / "templates" / "gemm_sm90_kernel.cu.j2").read_text()
    declared = {}
    for restype, name, params in re.findall(r"^(\w+\*?) \{\{ k\.symbol \}\}_(\w+)\(([^)]*)\)", text, re.M):
        argtypes = [c_types[p.rsplit(" ", 1)[0]] for p in params.split(", ") if p]
        declared[name] = (c_types[restype], argtypes)
    assert declared == ENTRY_POINTS


def test_the_version_function_is_the_one_the_loader_calls():
    unit = (REPO / "templates" / "gemm_sm90_unit.cu.j2").read_text()
    assert f'extern "C" int {_abi.VERSION_SYMBOL}() {{ return CUTLASS_TUNE_ABI; }}' in unit

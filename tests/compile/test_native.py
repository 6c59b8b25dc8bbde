"""The native operators' build spec (compile/_native.py, kernel/_native.py): flags per torch, the
cache key, and the build's outcomes (published, recorded failure, refused damaged copy) with a
stand-in compiler. The real build is tests/runtime/test_native.py's (nvcc mark)."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from cutlass_tune.compile import KernelCache
from cutlass_tune.compile._native import build_native, loaded_libstdcxx, native_dir, native_spec
from cutlass_tune.kernel._native import LIBRARY, TorchABI, cached_builds, find_native, native_key

from .fake_nvcc import elf_library

CPU = TorchABI("2.13.0+cpu", True, None, ".cpython-311-x86_64-linux-gnu.so")
CUDA = dataclasses.replace(CPU, torch_version="2.11.0+cu130", cuda="13.0")


@pytest.fixture
def sources(tmp_path):
    folder = tmp_path / "native"
    folder.mkdir()
    (folder / "ops.cpp").write_text("// ops\n")
    (folder / "moe.cu").write_text("// glue kernels\n")
    (folder / "args.h").write_text("// struct\n")
    return folder


@pytest.fixture
def toolkit(tmp_path, monkeypatch):
    """A CUDA toolkit folder with an nvcc, as CUTLASS_TUNE_NVCC names it."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime_api.h").write_text("// the toolkit's header\n")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", str(nvcc))
    return home


def test_a_cpu_torch_builds_the_cpp_files_only_without_cuda(sources):
    spec = native_spec(sources, CPU)
    assert [p.name for p in spec.cpp] == ["ops.cpp"] and spec.cu == ()
    assert "-DCUTLASS_TUNE_NATIVE_CUDA=0" in spec.defines and "-D_GLIBCXX_USE_CXX11_ABI=1" in spec.defines
    assert not {"c10_cuda", "torch_cuda", "cudart"} & set(spec.libraries)
    assert {"c10", "torch", "torch_cpu", "torch_python"} <= set(spec.libraries)
    compile_cpp, link = spec.commands(Path("/b"))
    assert compile_cpp[:2] == [spec.cxx, "-c"] and str(sources / "ops.cpp") in compile_cpp
    assert any(flag.startswith("-I") and flag.endswith("torch/include") for flag in compile_cpp)
    assert link[-2:] == ["-o", f"/b/{LIBRARY}"] and "-ltorch_python" in link
    assert any(flag.startswith("-Wl,-rpath,") for flag in link)


def test_the_link_names_the_process_s_shared_cpp_runtime_before_the_driver_s_own(sources, tmp_path):
    """Guards the H200 crash: a library linked with members of a static libstdc++ segfaulted when
    a failed check formatted an integer (its own copy of the locale code beside torch's)."""
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33\n"
                    "7f02-7f03 r--p 0 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n7f04-7f05 rw-p 0 0 0 [heap]\n")
    assert loaded_libstdcxx(maps) == ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",)
    assert loaded_libstdcxx(tmp_path / "missing") == ()
    link = native_spec(sources, CPU).commands(Path("/b"))[-1]
    runtime = [arg for arg in link if "/libstdc++.so" in arg]
    assert runtime == list(loaded_libstdcxx())  # torch is imported: its runtime is in this process
    assert runtime and link.index(runtime[0]) < link.index("-ltorch_python")


def test_a_cuda_torch_adds_the_cu_files_cuda_headers_and_libraries(sources, toolkit):
    spec = native_spec(sources, CUDA)
    assert [p.name for p in spec.cu] == ["moe.cu"]
    assert "-DCUTLASS_TUNE_NATIVE_CUDA=1" in spec.defines
    assert {"c10_cuda", "torch_cuda", "cudart"} <= set(spec.libraries)
    assert str(toolkit / "include") in spec.include_dirs and str(toolkit / "lib64") in spec.library_dirs
    runs = spec.commands(Path("/b"))
    assert len(runs) == 3 and runs[1][0] == str(toolkit / "bin" / "nvcc") and "-c" in runs[1]
    assert any("sm_90a" in flag for flag in runs[1])


def test_the_toolkit_is_the_one_with_the_headers_not_a_wrapper_s_folder(sources, toolkit, tmp_path, monkeypatch):
    """Guards hosts whose nvcc on PATH is a wrapper script (/usr/local/bin/nvcc exec'ing the toolkit's)."""
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {toolkit / 'bin' / 'nvcc'} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", str(wrapper))
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert str(toolkit / "include") in native_spec(sources, CUDA).include_dirs


def test_the_key_changes_with_the_torch_abi_and_the_sources(sources):
    key = native_key(sources, CPU)
    assert native_key(sources, CPU) == key == native_spec(sources, CPU).key
    for changed in (dataclasses.replace(CPU, torch_version="2.12.0+cpu"), dataclasses.replace(CPU, cxx11_abi=False),
                    dataclasses.replace(CPU, python_abi=".cpython-312-x86_64-linux-gnu.so"), CUDA):
        assert native_key(sources, changed) != key, changed
    (sources / "args.h").write_text("// another struct\n")
    assert native_key(sources, CPU) != key
    edited = native_key(sources, CPU)
    (sources / "more.cpp").write_text("// a new file joins the build\n")
    assert native_key(sources, CPU) != edited
    assert [p.name for p in native_spec(sources, CPU).cpp] == ["more.cpp", "ops.cpp"]


def test_the_cu_files_do_not_change_a_cpu_key(sources):
    key = native_key(sources, CPU)
    (sources / "moe.cu").write_text("// changed\n")
    assert native_key(sources, CPU) == key


def _compiler(tmp_path, fail: bool) -> Path:
    """A stand-in g++: writes its -o file (an ELF library when linking), or fails with a diagnosis;
    each run leaves a line in calls.log."""
    script = tmp_path / ("bad-cxx" if fail else "cxx")
    library = tmp_path / "lib.bin"
    library.write_bytes(elf_library(("PyInit_cutlass_tune_native",)))
    script.write_text(f"""#!{sys.executable}
import shutil, sys
open({str(tmp_path / 'calls.log')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')
if {fail}:
    print('ops.cpp:12:3: error: no matching function for call to foo()')
    sys.exit(1)
out = sys.argv[sys.argv.index('-o') + 1]
shutil.copyfile({str(library)!r}, out)
""")
    script.chmod(0o755)
    return script


def _calls(tmp_path):
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_build_is_published_once_and_then_found(sources, tmp_path):
    spec = dataclasses.replace(native_spec(sources, CPU), cxx=str(_compiler(tmp_path, fail=False)))
    cache = KernelCache(tmp_path / "cache")
    built = build_native(spec, cache)
    assert built.library == native_dir(cache) / spec.key / LIBRARY and not built.cached
    assert not list(built.library.parent.glob("*.o"))
    calls = _calls(tmp_path)
    again = build_native(spec, cache)
    assert again.cached and again.library == built.library and _calls(tmp_path) == calls
    assert cached_builds(tmp_path / "cache") == native_dir(cache)  # the runtime looks where the build wrote


def test_a_failed_build_is_recorded_with_its_reason_and_not_retried_unless_asked(sources, tmp_path):
    spec = dataclasses.replace(native_spec(sources, CPU), cxx=str(_compiler(tmp_path, fail=True)))
    cache = KernelCache(tmp_path / "cache")
    failed = build_native(spec, cache)
    assert failed.library is None and "no matching function" in failed.reason
    calls = _calls(tmp_path)
    recorded = build_native(spec, cache)
    assert recorded.cached and "no matching function" in recorded.reason and _calls(tmp_path) == calls
    assert "no matching function" in find_native(spec.key, native_dir(cache)).reason
    build_native(spec, cache, retry=True)
    assert _calls(tmp_path) == calls + 1


def test_a_damaged_library_is_refused_and_rebuilt(sources, tmp_path):
    """Guards against serving a library changed after its build (a truncated copy would crash the loader)."""
    spec = dataclasses.replace(native_spec(sources, CPU), cxx=str(_compiler(tmp_path, fail=False)))
    cache = KernelCache(tmp_path / "cache")
    library = build_native(spec, cache).library
    with open(library, "ab") as f:
        f.write(b"tampered")
    refused = find_native(spec.key, native_dir(cache))
    assert refused.library is None and not refused.cached and "refused" in refused.reason
    rebuilt = build_native(spec, cache)
    assert rebuilt.library == library and not rebuilt.cached
    assert json.loads((library.parent / "library.json").read_text())["bytes"] == os.path.getsize(library)

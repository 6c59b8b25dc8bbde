import locale
import re

import pytest

from cutlass_tune.compile import find_toolchain
from cutlass_tune.compile._toolchain import cutlass_version, nvcc_version
from cutlass_tune.errors import ToolchainError


@pytest.fixture
def script(tmp_path):
    """A fake nvcc: a shell script with `body`, executable unless told otherwise."""
    def make(body: str, mode: int = 0o755):
        path = tmp_path / "nvcc"
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(mode)
        return str(path)
    return make


def one_line_error(call, match):
    with pytest.raises(ToolchainError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_reads_the_version(script):
    assert nvcc_version(script('echo "Cuda compilation tools, release 12.4, V12.4.131"')) == "12.4.131"


def test_missing_nvcc_cannot_be_run(tmp_path):
    missing = str(tmp_path / "nope" / "nvcc")
    one_line_error(lambda: nvcc_version(missing), f"^cannot run {re.escape(missing)}: ")


def test_nvcc_without_exec_permission_cannot_be_run(script):
    nvcc = script("echo V1.2.3", mode=0o644)
    one_line_error(lambda: nvcc_version(nvcc), f"^cannot run {re.escape(nvcc)}: .*Permission denied")


@pytest.mark.parametrize("body", ["echo 'this is not nvcc'", "true", "echo V12 >&2; exit 1"])
def test_garbage_output_has_no_version(script, body):
    nvcc = script(body)
    one_line_error(lambda: nvcc_version(nvcc), f"^cannot read the version of {re.escape(nvcc)}$")


@pytest.mark.skipif(locale.getpreferredencoding(False).lower().replace("-", "") != "utf8",
                    reason="the bytes below decode in a non-UTF-8 locale")
def test_binary_garbage_is_a_one_line_error(script):
    # Guards against: a binary nvcc --version output escaping as a UnicodeDecodeError traceback.
    nvcc = script(r"printf '\377\376garbage'")
    one_line_error(lambda: nvcc_version(nvcc), "cannot read the version")


def test_find_toolchain_reports_a_broken_nvcc_and_does_not_cache_it(script):
    nvcc = script("echo garbage")
    one_line_error(lambda: find_toolchain(nvcc), "cannot read the version")
    script('echo "Cuda compilation tools, release 12.4, V12.4.131"')
    assert find_toolchain(nvcc).nvcc_version == "12.4.131"
    find_toolchain.cache_clear()


def test_find_toolchain_without_any_nvcc(monkeypatch, tmp_path):
    monkeypatch.delenv("CUTLASS_TUNE_NVCC", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    find_toolchain.cache_clear()
    try:
        one_line_error(find_toolchain, "^nvcc not found: .*CUTLASS_TUNE_NVCC")
    finally:
        find_toolchain.cache_clear()


def test_unreadable_cutlass_version(tmp_path):
    header = tmp_path / "include" / "cutlass" / "version.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n")  # no PATCH
    one_line_error(lambda: cutlass_version(tmp_path), "^cannot read the CUTLASS version")
    header.write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 1\n")
    assert cutlass_version(tmp_path) == "4.2.1"

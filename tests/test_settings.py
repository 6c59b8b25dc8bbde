import sys
from pathlib import Path

import pytest

from cutlass_tune import settings
from cutlass_tune.compile import default_jobs
from cutlass_tune.errors import CutlassTuneError

NUMERIC = [
    ("CUTLASS_TUNE_JOBS", settings.compile_jobs),
    ("CUTLASS_TUNE_COMPILE_TIMEOUT", settings.compile_timeout_s),
    ("CUTLASS_TUNE_NVCC_MEMORY_GB", settings.nvcc_memory_bytes),
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("CUTLASS_TUNE_CACHE_DIR", "CUTLASS_TUNE_NVCC", "CUDA_HOME", "CUDA_PATH",
                 "CUTLASS_TUNE_MOE_BATCHED_ROWS", *(name for name, _ in NUMERIC)):
        monkeypatch.delenv(name, raising=False)


def fake_nvcc(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    return nvcc


def test_cache_dir_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CUTLASS_TUNE_CACHE_DIR", "~/kernels")
    assert settings.cache_dir() == tmp_path / "kernels"


@pytest.mark.skipif(sys.platform != "linux", reason="XDG_CACHE_HOME is the Linux user cache")
@pytest.mark.parametrize("value", [None, ""])
def test_cache_dir_defaults_to_the_user_cache(monkeypatch, tmp_path, value):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if value is not None:
        monkeypatch.setenv("CUTLASS_TUNE_CACHE_DIR", value)  # empty counts as unset
    assert settings.cache_dir() == tmp_path / "xdg" / "cutlass-tune"


def test_nvcc_variable_wins_over_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(fake_nvcc(tmp_path / "bin").parent))
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "/opt/my/nvcc")
    assert settings.nvcc_path() == "/opt/my/nvcc"


def test_nvcc_on_path_wins_over_cuda_home(monkeypatch, tmp_path):
    on_path = fake_nvcc(tmp_path / "bin")
    fake_nvcc(tmp_path / "cuda" / "bin")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "")  # empty counts as unset
    assert settings.nvcc_path() == str(on_path)


def test_nvcc_under_cuda_home_then_cuda_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    home, path = fake_nvcc(tmp_path / "home" / "bin"), fake_nvcc(tmp_path / "path" / "bin")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "path"))
    assert settings.nvcc_path() == str(path)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "home"))
    assert settings.nvcc_path() == str(home)


def test_nvcc_falls_back_to_usr_local_cuda_or_none(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    default = Path("/usr/local/cuda/bin/nvcc")
    assert settings.nvcc_path() == (str(default) if default.exists() else None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # no bin/nvcc there
    assert settings.nvcc_path() is None


def test_numeric_defaults():
    assert settings.compile_jobs() is None  # None: default_jobs() bounds it by cores and memory
    assert settings.compile_timeout_s() == 900.0
    assert settings.nvcc_memory_bytes() == 3_200_000_000


def test_numeric_values_are_read(monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_JOBS", "3")
    monkeypatch.setenv("CUTLASS_TUNE_COMPILE_TIMEOUT", "2.5")
    monkeypatch.setenv("CUTLASS_TUNE_NVCC_MEMORY_GB", "1.5")
    assert settings.compile_jobs() == 3 and isinstance(settings.compile_jobs(), int)
    assert default_jobs() == 3
    assert settings.compile_timeout_s() == 2.5
    assert settings.nvcc_memory_bytes() == 1_500_000_000
    settings.check()


@pytest.mark.parametrize("name, read", NUMERIC)
@pytest.mark.parametrize("raw", ["many", "0", "-2", "nan", "inf", "-inf", "1e999"])
def test_bad_numbers_are_one_line_errors_naming_the_variable(monkeypatch, name, read, raw):
    monkeypatch.setenv(name, raw)
    for call in (read, settings.check):
        with pytest.raises(CutlassTuneError, match=f"^{name}=") as err:
            call()
        assert "\n" not in str(err.value)


def test_jobs_must_be_a_whole_number(monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_JOBS", "2.5")
    with pytest.raises(CutlassTuneError, match="CUTLASS_TUNE_JOBS='2.5' is not a whole number"):
        settings.check()


@pytest.mark.parametrize("raw", ["1e-10", "1e300"])
def test_memory_that_is_no_usable_byte_count_is_refused(monkeypatch, raw):
    # Guards against: 1e-10 GB -> 0 bytes -> default_jobs() divides by zero; 1e300 GB -> int(inf)
    # raises OverflowError in check(): both tracebacks instead of a one-line error.
    monkeypatch.setenv("CUTLASS_TUNE_NVCC_MEMORY_GB", raw)
    try:
        settings.check()
    except CutlassTuneError:
        return
    assert default_jobs() >= 1


def test_moe_batched_rows_defaults_to_never_takes_zero_and_refuses_the_rest(monkeypatch):
    assert settings.moe_batched_rows() == 0
    for raw, want in (("0", 0), ("48", 48)):
        monkeypatch.setenv("CUTLASS_TUNE_MOE_BATCHED_ROWS", raw)
        assert settings.moe_batched_rows() == want
    for raw in ("-1", "2.5", "many"):
        monkeypatch.setenv("CUTLASS_TUNE_MOE_BATCHED_ROWS", raw)
        with pytest.raises(CutlassTuneError, match=f"^CUTLASS_TUNE_MOE_BATCHED_ROWS='{raw}' must be a whole number"):
            settings.check()

import ctypes
from pathlib import Path

import pytest

from cutlass_tune.compile import KernelCache, Toolchain, compile_kernels, find_toolchain
from cutlass_tune.compile._toolchain import cutlass_source_root
from cutlass_tune.kernel import ABI_VERSION
from cutlass_tune.space import check_config, smem_usage
from cutlass_tune.space.cutlass import KERNEL_SMEM_ALLOWANCE_BYTES, SMEM_CAPACITY_BYTES
from cutlass_tune.status import Status

FAKE_NVCC = Path(__file__).with_name("fake_nvcc.py")


@pytest.fixture
def fake_toolchain():
    return Toolchain(nvcc=str(FAKE_NVCC), nvcc_version="99.0.1",
                     cutlass_root=cutlass_source_root(), cutlass_version="4.2.0")


@pytest.fixture
def cache(tmp_path):
    return KernelCache(tmp_path / "cache")


@pytest.fixture
def nvcc_calls(tmp_path, monkeypatch):
    """Directory collecting one file per fake nvcc call."""
    d = tmp_path / "calls"
    d.mkdir()
    monkeypatch.setenv("FAKE_NVCC_LOG_DIR", str(d))
    return lambda: sorted(p.read_text() for p in d.iterdir())


def build_and_check_smem(configs, cache_dir):
    """Compile accepted configs with the real nvcc; check each builds without spills, loads,
    reports our ABI, runs one wgmma as wide as its tile N, and that the smem model matches what
    CUTLASS computed (exact stages; bytes overestimated by at most the kernel allowance, never
    under). Returns the CompiledKernels."""
    for cfg in configs:
        assert check_config(cfg) == [], cfg.name
    results = compile_kernels(configs, cache=KernelCache(cache_dir), toolchain=find_toolchain(), jobs=2)
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
        assert not r.reason, f"{r.config.name}: {r.reason}"  # e.g. ptxas spilled
    for r in results:
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        actual = getattr(lib, f"{r.symbol}_shared_storage_bytes")()
        model = smem_usage(r.config)
        assert getattr(lib, f"{r.symbol}_stages")() == model.stages, r.config.name
        # One wgmma spans the whole tile N (tile N 160 once ran five 64x32 ones at 0.71 of cuBLAS).
        assert getattr(lib, f"{r.symbol}_mma_n")() == r.config.tile_n, r.config.name
        assert actual <= SMEM_CAPACITY_BYTES
        assert actual <= model.total_bytes, (r.config.name, actual, model)
        assert model.total_bytes - actual <= KERNEL_SMEM_ALLOWANCE_BYTES, (r.config.name, actual, model)
    return results

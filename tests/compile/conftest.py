import os
from pathlib import Path

import pytest

from cutlass_tune.compile import KernelCache, Toolchain
from cutlass_tune.compile._toolchain import cutlass_source_root

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

"""Loading a kernel library: what is refused, and the host-side entry points of built ones."""

import pytest

from cutlass_tune.kernel import KernelLoadError, LoadedKernel, _loaded, make_args
from cutlass_tune.space import Problem, RuntimeArgs, smem_usage


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
    monkeypatch.setattr(_loaded, "ABI_VERSION", _loaded.ABI_VERSION + 1)
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

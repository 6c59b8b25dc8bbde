import pytest

from cutlass_tune.compile import compile_kernels
from cutlass_tune.space import KernelConfig, TileScheduler
from cutlass_tune.status import Status

from .abi import build_faulty

COOPERATIVE = KernelConfig(tile_m=128, tile_n=128, tile_k=64)
STREAM_K = KernelConfig(tile_m=128, tile_n=256, tile_k=64, cluster_m=2,
                        tile_scheduler=TileScheduler.STREAM_K)


def _compiled(configs):
    # The user's kernel cache (CUTLASS_TUNE_CACHE_DIR): a rerun finds them built.
    results = compile_kernels(configs)
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


@pytest.fixture(scope="session")
def faulty_library(tmp_path_factory):
    return build_faulty(tmp_path_factory.mktemp("faulty"))


@pytest.fixture(scope="session")
def cooperative_kernel():
    """128x128x64 cooperative persistent bf16 TN kernel."""
    return _compiled([COOPERATIVE])[0]


@pytest.fixture(scope="session")
def gpu_kernels():
    """The cooperative kernel and a Stream-K one, compiled in parallel."""
    cooperative, stream_k = _compiled([COOPERATIVE, STREAM_K])
    return {"cooperative": cooperative, "stream_k": stream_k}

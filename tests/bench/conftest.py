import pytest
import torch

from cutlass_tune.bench._verify import allocate, randomize
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule, RuntimeArgs, TileScheduler
from cutlass_tune.status import Status

from .abi import build_faulty

COOPERATIVE = KernelConfig(tile_m=128, tile_n=128, tile_k=64)
STREAM_K = KernelConfig(tile_m=128, tile_n=256, tile_k=64, cluster_m=2,
                        tile_scheduler=TileScheduler.STREAM_K)
SOURCELESS = KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                          epilogue_tile_n=64, epilogue_source=False)


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
    """The cooperative kernel, a Stream-K one and a ping-pong one without a C operand,
    compiled in parallel."""
    cooperative, stream_k, sourceless = _compiled([COOPERATIVE, STREAM_K, SOURCELESS])
    return {"cooperative": cooperative, "stream_k": stream_k, "sourceless": sourceless}


def launch_once(compiled, problem, seed=0):
    """Run a compiled kernel once on fresh random operands (output poisoned with NaN first)
    on GPU 0 and return the operands, synchronized."""
    kernel = LoadedKernel(compiled.library, compiled.symbol)
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(seed))
    args = make_args(problem, RuntimeArgs(), a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                     device_id=0, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    assert kernel.can_implement(args) == 0 and kernel.workspace_size(args) == 0
    stream = torch.cuda.current_stream().cuda_stream
    ops.d.fill_(float("nan"))
    with kernel.create() as gemm:
        gemm.initialize(args, None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    return ops


def spy_on_timing(monkeypatch):
    """Record, for each call of the runner's timing function, the target classes it timed:
    the kernel's, then those of the sides timed with it (the paired baseline, a baseline row's
    torch paths)."""
    from cutlass_tune.bench import _runner

    timed = []
    real = _runner.time_sides

    def spy(launches, **kw):
        timed.append(tuple(type(f.__self__).__name__ for f in launches))
        return real(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", spy)
    return timed

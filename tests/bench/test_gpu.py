"""On a Hopper GPU: real kernels against torch, fault isolation, one timing function for all.

Run with `python3 -m pytest tests/bench -m gpu` on the GPU host (nvcc builds the kernels into
the kernel cache first; about a minute on 16 cores).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions, Worker, _runner, compare, time_paired
from cutlass_tune.bench._verify import ELEMENT_TOLERANCE, reference
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.space import Decomposition, DType, Problem, RasterOrder, RuntimeArgs
from cutlass_tune.status import Status

from .conftest import launch_once, spy_on_timing

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

REPO = Path(__file__).resolve().parents[2]
SHORT = TimingOptions(budget_ms=20, warmup_ms=5)


def _rel(out, ref):
    return (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)).item()


def test_a_real_kernel_matches_torch_at_4096_bf16_tn(gpu_kernels):
    ops = launch_once(gpu_kernels["cooperative"], Problem(4096, 4096, 4096))
    ref = reference(ops)
    cublas = torch.matmul(ops.a, ops.b.t())  # nn.Linear's layout: B stored N x K
    assert _rel(ops.d, ref) < 1e-2 and _rel(cublas, ref) < 1e-2
    torch.testing.assert_close(ops.d.float(), cublas.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (2048, 1024, 3072)])
def test_a_kernel_without_c_operand_matches_torch(gpu_kernels, shape):
    ops = launch_once(gpu_kernels["sourceless"], Problem(*shape))
    assert _rel(ops.d, reference(ops)) < 1e-2


ODD = Problem(4097, 1288, 4112)  # no tile divides M, N or K: partial tiles and a K residue


@pytest.mark.parametrize("kind", ["cooperative", "sourceless"])
def test_partial_tiles_match_torch_element_by_element(gpu_kernels, kind):
    # Guards against wrong edge tiles, which a Frobenius average over the whole output can hide.
    ops = launch_once(gpu_kernels[kind], ODD)
    ref = reference(ops)
    rms = ref.pow(2).mean().sqrt().item()
    torch.testing.assert_close(ops.d.float(), ref, rtol=2 ** -7, atol=1e-2 * rms)
    verdict = compare(ops.d, ref, DType.BF16)
    print(f"\n{kind} {ODD.name}: relative error {verdict.rel_error:.2e}, worst element "
          f"{verdict.worst_error:.3f} RMS")
    assert verdict.status is Status.OK and verdict.worst_error < ELEMENT_TOLERANCE[DType.BF16] / 2


def test_stream_k_partial_tiles_verify_in_every_decomposition(gpu_kernels):
    variants = (RuntimeArgs(), RuntimeArgs(splits=3, decomposition=Decomposition.SPLIT_K),
                RuntimeArgs(decomposition=Decomposition.STREAM_K))
    with Worker(0, timeout_s=60) as worker:
        results = list(worker.run(Job.for_kernel(gpu_kernels["stream_k"], ODD, variants, timing=SHORT)))
    for m in results:
        print(f"\nStream-K {m.runtime.name} {ODD.name}: {m.status.value}, worst element {m.worst_error} RMS")
        assert m.status is Status.OK, (m.runtime.name, m.reason)
        assert m.worst_error < ELEMENT_TOLERANCE[DType.BF16] / 2


def test_faulting_hanging_and_corrupt_kernels_do_not_stop_a_good_one(gpu_kernels, faulty_library):
    p = Problem(1024, 1024, 1024)
    good = Job.for_kernel(gpu_kernels["cooperative"], p, (RuntimeArgs(),), timing=SHORT)

    def faulty(symbol):
        return Job(problem=p, variants=(RuntimeArgs(),), library=faulty_library, symbol=symbol, timing=SHORT)

    order = [("good", good), ("fault", faulty("ct_fault")), ("after_fault", good),
             ("hang", faulty("ct_hang")), ("corrupt", faulty("ct_corrupt")), ("after_all", good)]
    with Worker(0, timeout_s=30) as worker:
        results = {name: list(worker.run(job)) for name, job in order}
        starts = worker.starts
    status = {name: [m.status for m in ms] for name, ms in results.items()}
    assert status == {"good": [Status.OK], "fault": [Status.RUNTIME_ERROR], "after_fault": [Status.OK],
                      "hang": [Status.TIMEOUT], "corrupt": [Status.WRONG_RESULT], "after_all": [Status.OK]}
    assert starts == 3  # the first, after the CUDA error, after the hang
    assert results["fault"][0].reason
    assert results["corrupt"][0].rel_error > 0.5
    for name in ("good", "after_fault", "after_all"):
        m = results[name][0]
        assert m.rel_error < 1e-2 and m.samples >= 10 and m.tflops > 0 and m.env.sm_count > 0


def test_stream_k_variants_run_without_recompiling(gpu_kernels):
    variants = (
        RuntimeArgs(),
        RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=2),
        RuntimeArgs(splits=2, decomposition=Decomposition.SPLIT_K),
        RuntimeArgs(decomposition=Decomposition.STREAM_K),
        RuntimeArgs(decomposition=Decomposition.DATA_PARALLEL),
    )
    job = Job.for_kernel(gpu_kernels["stream_k"], Problem(4096, 4096, 4096), variants, timing=SHORT)
    with Worker(0, timeout_s=60) as worker:
        results = list(worker.run(job))
        assert worker.starts == 1
    for m in results:
        # Repeated launches must re-zero the workspace: a stale barrier hangs or corrupts.
        assert m.status is Status.OK, (m.runtime.name, m.reason)
        assert m.rel_error < 1e-2


def test_baseline_and_kernel_are_timed_by_the_same_function(gpu_kernels, monkeypatch):
    timed = spy_on_timing(monkeypatch)
    runner = GpuRunner(0)
    p = Problem(2048, 2048, 2048)
    paired = TimingOptions(budget_ms=40, warmup_ms=5, paired=True)
    [base] = runner(Job.baseline(p, timing=SHORT))
    [kern] = runner(Job.for_kernel(gpu_kernels["cooperative"], p, (RuntimeArgs(),), timing=SHORT))
    [pair] = runner(Job.for_kernel(gpu_kernels["cooperative"], p, (RuntimeArgs(),), timing=paired))
    assert timed == [("CublasTarget",), ("CutlassTarget",), ("CutlassTarget", "CublasTarget")]
    assert base.status is Status.OK and kern.status is Status.OK and pair.status is Status.OK
    assert base.method == kern.method == pair.method == "events" and base.env == kern.env
    assert base.rel_error < 1e-2 and 0.2 < base.median_ms / kern.median_ms < 5
    assert kern.baseline_median_ms is None and 0.2 < pair.paired_ratio < 5
    print(f"\n2048^3 cooperative: alone {kern.median_ms * 1e3:.1f} us, cuBLAS before it "
          f"{base.median_ms * 1e3:.1f} us; paired {pair.median_ms * 1e3:.1f} us vs cuBLAS "
          f"{pair.baseline_median_ms * 1e3:.1f} us, ratio {pair.paired_ratio:.3f}")


@pytest.mark.parametrize("size", [1024, 4096])
def test_cublas_paired_with_itself_reads_even(size):
    """The A/A check of paired timing: cuBLAS against cuBLAS must come out at 1.0."""
    runner = GpuRunner(0)
    ops = runner._operands(Problem(size, size, size))
    first, second = _runner.CublasTarget(ops.problem), _runner.CublasTarget(ops.problem)
    first.setup(RuntimeArgs(), ops)
    second.setup(RuntimeArgs(), ops)
    a, b = time_paired(first.launch, second.launch, options=TimingOptions(budget_ms=200, paired=True),
                       flush=runner._flush)
    print(f"\n{size}^3 cuBLAS vs cuBLAS: {a.median_ms * 1e3:.2f} / {b.median_ms * 1e3:.2f} us "
          f"({a.samples} pairs), ratio {b.median_ms / a.median_ms:.4f}")
    assert b.median_ms / a.median_ms == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("host_delay_ms", [0.0, 0.5])
def test_host_time_stays_out_of_the_samples(host_delay_ms):
    """A launch whose host side stalls (a busy CPU) times like one that does not: samples the
    GPU reached before the launch was enqueued are dropped, and a GPU spin lets the host get
    ahead again."""
    import time

    runner = GpuRunner(0)
    ops = runner._operands(Problem(256, 256, 256))
    cublas = _runner.CublasTarget(ops.problem)
    cublas.setup(RuntimeArgs(), ops)

    def stalled():
        time.sleep(host_delay_ms / 1e3)
        cublas.launch()

    stats = time_paired(stalled, None, options=TimingOptions(budget_ms=20, warmup_ms=5),
                                flush=runner._flush)[0]
    print(f"\n256^3 cuBLAS, host stall {host_delay_ms} ms per launch: median {stats.median_ms * 1e3:.1f} us, "
          f"p20-p80 {stats.p20_ms * 1e3:.1f}-{stats.p80_ms * 1e3:.1f} us, {stats.samples} kept, "
          f"{stats.dropped} dropped")
    assert stats.median_ms < 0.05  # a 6 us kernel, not the 500 us stall
    if host_delay_ms:
        assert stats.dropped >= 1


def test_graph_timing_of_small_problems(gpu_kernels):
    runner = GpuRunner(0)
    p = Problem(512, 512, 512)
    timing = TimingOptions(budget_ms=20, warmup_ms=5, method=TimingMethod.GRAPH)
    results = list(runner(Job.baseline(p, timing=timing)))
    for name in ("cooperative", "stream_k"):
        results += runner(Job.for_kernel(gpu_kernels[name], p, (RuntimeArgs(),), timing=timing))
    for m in results:
        assert m.status is Status.OK, (m.kernel_name, m.reason)
        assert m.method == "graph" and m.median_ms > 0 and m.rel_error < 1e-2


def test_cli_bench_measures_twice_and_writes_every_result(gpu_kernels, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "problems: {m: 1024, n: 1024, k: 1024}\n"
        "kernels: {tile_m: 128, tile_n: 128, tile_k: 64, kernel_schedule: cooperative}\n"
        "runtime: {raster: [heuristic, along_n], swizzle: [1]}\n"
    )
    output = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "bench", str(config), "--repeat", "2",
                        "--output", str(output)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(lines) == 2 * (1 + 2)
    assert all(line["status"] == "ok" for line in lines)
    assert sum(line["is_baseline"] for line in lines) == 2
    assert "vs cuBLAS" in r.stdout and "run-to-run" in r.stdout

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from cutlass_tune.compile import compile_kernels, plan_units, spill_bytes_by_symbol
from cutlass_tune.render import kernel_symbol
from cutlass_tune.space import KernelConfig
from cutlass_tune.status import Status

from .conftest import FAKE_NVCC

REPO = Path(__file__).resolve().parents[2]
CONFIGS = [KernelConfig(tile_n=n, cluster_m=c) for n in (64, 128, 256) for c in (1, 2)]


def test_compiles_then_serves_from_cache(fake_toolchain, cache, nvcc_calls):
    first = compile_kernels(CONFIGS, cache=cache, toolchain=fake_toolchain, jobs=2, kernels_per_unit=1)
    assert [r.status for r in first] == [Status.OK] * len(CONFIGS)
    assert [r.config for r in first] == CONFIGS
    assert all(r.library.exists() and not r.cached for r in first)
    assert len(nvcc_calls()) == len(CONFIGS)
    again = compile_kernels(CONFIGS, cache=cache, toolchain=fake_toolchain, jobs=2)
    assert all(r.cached and r.status is Status.OK for r in again)
    assert [r.library for r in again] == [r.library for r in first]
    assert len(nvcc_calls()) == len(CONFIGS)  # nothing rebuilt
    assert not list((cache.root / "tmp").iterdir())


def test_key_covers_the_toolchain(fake_toolchain, cache, nvcc_calls):
    compile_kernels(CONFIGS[:1], cache=cache, toolchain=fake_toolchain, jobs=1)
    newer = dataclasses.replace(fake_toolchain, nvcc_version="99.0.2")
    assert not compile_kernels(CONFIGS[:1], cache=cache, toolchain=newer, jobs=1)[0].cached
    flags = dataclasses.replace(fake_toolchain, flags=fake_toolchain.flags + ("-lineinfo",))
    assert not compile_kernels(CONFIGS[:1], cache=cache, toolchain=flags, jobs=1)[0].cached
    assert len(nvcc_calls()) == 3


def test_batched_units_share_one_nvcc_call(fake_toolchain, cache, nvcc_calls):
    results = compile_kernels(CONFIGS[:4], cache=cache, toolchain=fake_toolchain, jobs=1, kernels_per_unit=4)
    assert len(nvcc_calls()) == 1
    assert len({r.library for r in results}) == 1
    for r in results:
        assert f"namespace {kernel_symbol(r.config)} {{" in r.source_path.read_text()


def test_a_failure_in_a_batch_is_attributed_and_cached(fake_toolchain, cache, nvcc_calls, monkeypatch):
    bad = CONFIGS[1]
    monkeypatch.setenv("FAKE_NVCC_FAIL_IF", f"namespace {kernel_symbol(bad)} {{")
    results = compile_kernels(CONFIGS[:4], cache=cache, toolchain=fake_toolchain, jobs=1, kernels_per_unit=4)
    status = {r.config.hash: r for r in results}
    assert status[bad.hash].status is Status.COMPILE_ERROR
    assert "planted failure" in status[bad.hash].reason
    assert re.findall(r"namespace (ct_\w+) \{", status[bad.hash].source_path.read_text()) == [kernel_symbol(bad)]
    assert "planted failure" in status[bad.hash].log_path.read_text()
    assert [r.status for r in results if r.config != bad] == [Status.OK] * 3
    calls = len(nvcc_calls())
    assert calls == 1 + 4  # the batch, then each kernel alone
    again = compile_kernels(CONFIGS[:4], cache=cache, toolchain=fake_toolchain, jobs=1)
    assert {r.config.hash: r.status for r in again} == {h: r.status for h, r in status.items()}
    assert len(nvcc_calls()) == calls  # the failure was cached, not retried


def test_timeout_is_recorded_and_not_cached(fake_toolchain, cache, nvcc_calls, monkeypatch):
    slow = CONFIGS[0]
    monkeypatch.setenv("FAKE_NVCC_HANG_IF", f"namespace {kernel_symbol(slow)} {{")
    start = time.monotonic()
    results = compile_kernels(CONFIGS[:2], cache=cache, toolchain=fake_toolchain, jobs=2,
                              kernels_per_unit=1, timeout=1.0)
    assert time.monotonic() - start < 10
    assert [r.status for r in results] == [Status.TIMEOUT, Status.OK]
    assert "exceeded" in results[0].reason and results[0].source_path.exists()
    assert cache.lookup(results[0].key, slow) is None
    monkeypatch.delenv("FAKE_NVCC_HANG_IF")
    assert compile_kernels([slow], cache=cache, toolchain=fake_toolchain, jobs=1)[0].status is Status.OK


def test_jobs_run_in_parallel(fake_toolchain, cache, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "1.0")
    start = time.monotonic()
    compile_kernels(CONFIGS[:4], cache=cache, toolchain=fake_toolchain, jobs=4, kernels_per_unit=1)
    assert time.monotonic() - start < 3.0


_RACE = """
import sys
from pathlib import Path
from cutlass_tune.compile import KernelCache, Toolchain, compile_kernels
from cutlass_tune.compile._toolchain import cutlass_source_root
from cutlass_tune.space import KernelConfig
tc = Toolchain(nvcc=sys.argv[2], nvcc_version="99.0.1", cutlass_root=cutlass_source_root(), cutlass_version="4.2.0")
configs = [KernelConfig(tile_n=n, cluster_m=c) for n in (64, 128, 256) for c in (1, 2)]
rs = compile_kernels(configs, cache=KernelCache(Path(sys.argv[1])), toolchain=tc, jobs=3, kernels_per_unit=1)
print(sum(r.status.value == "ok" for r in rs))
"""


def test_concurrent_processes_build_each_kernel_once(tmp_path, nvcc_calls, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.5")
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path / "shared"), str(FAKE_NVCC)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == [str(len(CONFIGS))] * 2
    assert len(nvcc_calls()) == len(CONFIGS)


def test_interrupt_leaves_nothing_half_written(tmp_path, monkeypatch):
    space = tmp_path / "space.yaml"
    space.write_text("problems: {m: 128, n: 128, k: 128}\nkernels: {tile_n: [64, 128]}\n")
    env = dict(os.environ, CUTLASS_TUNE_NVCC=str(FAKE_NVCC), FAKE_NVCC_SLEEP="30",
               CUTLASS_TUNE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "cutlass_tune.cli", "compile", str(space), "-j", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = tmp_path / "cache" / "v1"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ((root / "tmp").exists() and any((root / "tmp").iterdir())):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert not list((root / "units").iterdir())
    assert not list((root / "kernels").iterdir())
    assert not list((root / "tmp").iterdir())
    leftover = subprocess.run(["pgrep", "-f", "fake_nvcc.py"], capture_output=True, text=True).stdout
    assert leftover.strip() == ""


def test_unit_plan_batches_only_when_kernels_outnumber_slots():
    assert [len(u) for u in plan_units(CONFIGS[:4], jobs=16, kernels_per_unit=None)] == [1] * 4
    assert [len(u) for u in plan_units(CONFIGS, jobs=2, kernels_per_unit=None)] == [3, 3]
    many = CONFIGS * 20  # plan_units does not care about duplicates
    assert max(len(u) for u in plan_units(many, jobs=2, kernels_per_unit=None)) == 4
    assert [len(u) for u in plan_units(CONFIGS, jobs=16, kernels_per_unit=4)] == [4, 2]


def test_spill_report_is_attributed_to_its_kernel():
    log = """ptxas info    : Compiling entry function '_ZN19ct_aaaaaaaaaaaaaaaa6kernelEv' for 'sm_90a'
ptxas info    : Function properties for _ZN19ct_aaaaaaaaaaaaaaaa6kernelEv
    4766 bytes stack frame, 4766 bytes spill stores, 4700 bytes spill loads
ptxas info    : Compiling entry function '_ZN19ct_bbbbbbbbbbbbbbbb6kernelEv' for 'sm_90a'
ptxas info    : Function properties for _ZN19ct_bbbbbbbbbbbbbbbb6kernelEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
    assert spill_bytes_by_symbol(log, ["ct_aaaaaaaaaaaaaaaa", "ct_bbbbbbbbbbbbbbbb"]) == {
        "ct_aaaaaaaaaaaaaaaa": 9466, "ct_bbbbbbbbbbbbbbbb": 0}


def test_spills_of_a_real_log_are_charged_to_the_units_kernels():
    # Regression: ptxas names kernels by their mangled CUTLASS type, never by our symbol, so
    # spills of real builds were never reported.
    mangled = "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalEEEvNT_6ParamsE"
    log = f"""ptxas info    : Compiling entry function '{mangled}' for 'sm_90a'
ptxas info    : Function properties for {mangled}
    0 bytes stack frame, 858 bytes spill stores, 632 bytes spill loads
"""
    assert spill_bytes_by_symbol(log, ["ct_aaaaaaaaaaaaaaaa"]) == {"ct_aaaaaaaaaaaaaaaa": 1490}
    assert spill_bytes_by_symbol(log, ["ct_a", "ct_b"]) == {"ct_a": 1490, "ct_b": 1490}

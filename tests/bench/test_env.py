import sys

from cutlass_tune.bench import ClockMonitor, _env
from cutlass_tune.bench._env import parse_driver_version
from cutlass_tune.measurement import Clocks, decode_reasons


def test_throttle_reasons_are_decoded_by_bit():
    assert decode_reasons(0) == ()
    assert decode_reasons(0x1 | 0x4 | 0x40) == ("gpu_idle", "sw_power_cap", "hw_thermal_slowdown")
    assert decode_reasons(0x800) == ("0x800",)


def test_only_slowdowns_count_as_throttling():
    assert not Clocks(reasons=("gpu_idle", "applications_clocks_setting")).throttled
    # Regression: every GEMM at the power limit was flagged throttled.
    assert not Clocks(reasons=("gpu_idle", "sw_power_cap")).throttled
    assert Clocks(reasons=("hw_slowdown",)).throttled


def test_clocks_around_a_measurement_keep_every_reason_seen():
    before = Clocks(sm_mhz=1980, reasons=("gpu_idle",))
    after = Clocks(sm_mhz=1755, reasons=("sw_thermal_slowdown",))
    both = Clocks.around(before, after)
    assert both.sm_mhz == 1755 and both.reasons == ("gpu_idle", "sw_thermal_slowdown") and both.throttled
    assert Clocks.around(None, after) == after and Clocks.around(before, None) == before
    assert Clocks.around(None, None) is None


def test_driver_version_from_proc():
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    open_ = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
             "(dvs-builder@U16)  Sun Jul 27 07:09:35 UTC 2025\nGCC version:  gcc version 12.2.0\n")
    assert parse_driver_version(closed) == "550.54.15"
    assert parse_driver_version(open_) == "580.65.06"
    assert parse_driver_version("") is None


def test_without_pynvml_clocks_are_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    _env._nvml.cache_clear()
    try:
        assert ClockMonitor(0).read() is None
    finally:
        _env._nvml.cache_clear()

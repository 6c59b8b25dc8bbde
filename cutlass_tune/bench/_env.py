"""What a measurement ran on: the environment stamp and the GPU clocks around it.

Clocks and throttle reasons come from NVML (module `pynvml`, package nvidia-ml-py). It is
imported lazily; without it, or when NVML cannot start, clocks are None and nothing fails.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

# nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*), fixed by the NVML ABI.
THROTTLE_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "sw_power_cap"})
"""Reasons that do not mark a measurement throttled. A dense GEMM on an H100/H200 runs at the
board's power limit (on the H200 host every one of 339 measurements on 2026-11-21 had
sw_power_cap set, at 1500-1620 MHz): the clock a kernel sustains there is part of its speed.
Thermal and hardware slowdowns are not, and mark the measurement."""


def decode_reasons(mask: int) -> tuple[str, ...]:
    """Names of the throttle-reason bits set in `mask` (unknown bits as hex)."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class Clocks:
    """GPU state read through NVML. Fields NVML does not report on a device are None."""

    sm_mhz: int | None = None
    mem_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def throttled(self) -> bool:
        return any(r not in BENIGN_REASONS for r in self.reasons)

    @classmethod
    def around(cls, before: Clocks | None, after: Clocks | None) -> Clocks | None:
        """One record for a measurement: the readings after it, and every throttle reason seen
        before or after it."""
        if after is None:
            return before
        if before is None:
            return after
        reasons = tuple(sorted(set(before.reasons) | set(after.reasons)))
        return dataclasses.replace(after, reasons=reasons)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Clocks:
        return cls(**{**data, "reasons": tuple(data.get("reasons", ()))})


@dataclasses.dataclass(frozen=True)
class EnvStamp:
    """The machine and software a measurement ran on. Versions that cannot be read are None."""

    host: str
    gpu: str
    capability: str
    sm_count: int
    l2_bytes: int
    driver: str | None
    cuda_runtime: str | None
    torch: str
    nvcc: str | None
    cutlass: str | None
    device: int | None = None
    """CUDA device index in the measuring process (None in records older than multi-GPU sweeps)."""
    gpu_uuid: str | None = None
    """Which board it was, where a host has several of one model."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvStamp:
        return cls(**data)


@functools.cache
def _nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError and its many subclasses, or a missing libnvidia-ml
        return None
    return pynvml


def parse_driver_version(proc_text: str) -> str | None:
    """The driver version in the text of /proc/driver/nvidia/version."""
    found = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", proc_text)
    return found.group(1) if found else None


def driver_version() -> str | None:
    nvml = _nvml()
    if nvml is not None:
        try:
            return str(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
    try:
        return parse_driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def env_stamp(device: int) -> EnvStamp:
    """Stamp for CUDA device `device` (initializes CUDA in this process)."""
    import torch

    from ..compile import find_toolchain
    from ..errors import ToolchainError

    props = torch.cuda.get_device_properties(device)
    try:
        toolchain = find_toolchain()
        nvcc, cutlass = toolchain.nvcc_version, toolchain.cutlass_version
    except ToolchainError:
        nvcc = cutlass = None
    return EnvStamp(
        host=socket.gethostname(),
        gpu=props.name,
        capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size,
        driver=driver_version(),
        cuda_runtime=torch.version.cuda,
        torch=torch.__version__,
        nvcc=nvcc,
        cutlass=cutlass,
        device=device,
        gpu_uuid=f"GPU-{props.uuid}" if getattr(props, "uuid", None) is not None else None,
    )


class ClockMonitor:
    """Reads clocks and throttle reasons of one CUDA device; `read()` is None without NVML."""

    def __init__(self, device: int):
        self._nvml = _nvml()
        self._handle = self._find_handle(device) if self._nvml else None

    def _find_handle(self, device: int) -> Any:
        import torch

        nvml = self._nvml
        # NVML numbers devices without CUDA_VISIBLE_DEVICES; the UUID names the same one.
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                pass
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            try:
                return nvml.nvmlDeviceGetHandleByIndex(device)
            except Exception:
                pass
        return None

    def _query(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, name)(self._handle, *args)
        except Exception:
            return None

    def read(self) -> Clocks | None:
        if self._handle is None:
            return None
        nvml = self._nvml
        reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons"
                      if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                      else "nvmlDeviceGetCurrentClocksThrottleReasons")
        mask = self._query(reasons_fn)
        power_mw = self._query("nvmlDeviceGetPowerUsage")
        return Clocks(
            sm_mhz=self._query("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM),
            mem_mhz=self._query("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM),
            temperature_c=self._query("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU),
            power_w=power_mw / 1000 if power_mw is not None else None,
            reasons=decode_reasons(mask) if mask is not None else (),
        )

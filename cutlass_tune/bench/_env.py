"""Reading what a measurement runs on: the environment stamp and the GPU clocks around it.

Clocks and throttle reasons come from NVML (module `pynvml`, package nvidia-ml-py). It is
imported lazily; without it, or when NVML cannot start, clocks are None and nothing fails.
The record types (`Clocks`, `EnvStamp`) live in `cutlass_tune.measurement`, free of torch.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

from ..compile import find_toolchain
from ..errors import ToolchainError
from ..measurement import Clocks, EnvStamp, decode_reasons
from ._timing import Reading


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
    import torch  # in the GPU worker only: the parent process stays free of CUDA

    props = torch.cuda.get_device_properties(device)
    nvcc: str | None
    cutlass: str | None
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
        self._handle = self._find_handle(self._nvml, device) if self._nvml else None

    @staticmethod
    def _find_handle(nvml: ModuleType, device: int) -> Any:
        import torch

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

    def reading(self) -> Reading:
        """The energy counter and SM clock now (see `_timing.Reading`); empty without NVML."""
        if self._handle is None or self._nvml is None:
            return Reading()
        return Reading(energy_mj=self._query("nvmlDeviceGetTotalEnergyConsumption"),
                       sm_mhz=self._query("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM))

    def read(self) -> Clocks | None:
        nvml = self._nvml
        if self._handle is None or nvml is None:
            return None
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

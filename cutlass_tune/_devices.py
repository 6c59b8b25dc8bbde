"""Whether this host surely has no CUDA GPU, known in milliseconds without importing torch: a
command that needs one says so before it spends seconds on imports and on its space."""

from __future__ import annotations

import glob
import os

NO_GPU_MESSAGE = "no CUDA GPU is visible; `cutlass-tune compile CONFIG` builds kernels without one"


def surely_no_gpu() -> bool:
    """True only where no CUDA device can be visible: CUDA_VISIBLE_DEVICES hides every device
    (empty, or starting with -1), or the host has neither an NVIDIA device node (/dev/nvidia0
    ...; /dev/dxg under WSL) nor a driver NVML can start. False where one may be (torch's own
    check then decides, as before)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return True
    if glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"):
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver library, or no driver loaded: NVML's errors are all "no GPU here"
        return True
    try:
        return pynvml.nvmlDeviceGetCount() == 0
    except Exception:
        return True
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # already down: nothing to release
            pass

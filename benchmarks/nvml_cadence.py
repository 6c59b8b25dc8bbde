"""How often NVML's total energy counter moves while the GPU runs GEMMs back to back.

    python3 benchmarks/nvml_cadence.py     # on the GPU host; prints the intervals between updates
"""

import statistics
import time

import pynvml
import torch

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
for _ in range(400):  # about 2.5 s of work, enqueued ahead
    torch.matmul(a, a)
done = torch.cuda.Event()
done.record()
changes, previous = [], pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
while not done.query():
    energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    if energy != previous:
        changes.append((time.perf_counter(), energy - previous))
        previous = energy
    time.sleep(0.0002)
gaps = [(b[0] - a[0]) * 1000 for a, b in zip(changes, changes[1:])]
print(f"{len(changes)} updates; ms between them: median {statistics.median(gaps):.1f}, "
      f"min {min(gaps):.1f}, max {max(gaps):.1f}; mJ per update median {statistics.median(d for _, d in changes):.0f}")

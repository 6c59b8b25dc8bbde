"""Where do accumulators start to spill? (CPU only: nvcc, no GPU.)

The rule `accumulator_registers` once stopped at 192 fp32 accumulators per consumer thread:
192 measured clean, 224 spilled and ran at 0.05 of cuBLAS, and 193-223 was not measured. This
renders a ping-pong 128x160 unit (which enables the extended wgmma shapes), edits its tile N to
each width below, compiles each with the driver's own flags (`-Xptxas=-v`) and prints ptxas's
registers and spill bytes for the GEMM kernel. Tile M 128 ping-pong: accumulators = tile N;
cooperative 256xN: the same count per thread. Sourceless units, and two with a C operand.
It found 208 clean, and the rule's bound moved to 208 (results in
benchmarks/results/accumulator_spills_20261121.txt, speed in benchmarks/beat_cublas.md).

    python3 benchmarks/accumulator_spills.py [--jobs 2]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cutlass_tune.compile import find_toolchain
from cutlass_tune.render import render_unit
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule

WIDTHS = (176, 192, 208, 224)
ENTRY = re.compile(r"Compiling entry function '(\S+)'")
USED = re.compile(r"Used (\d+) registers")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def unit_source(schedule: KernelSchedule, tile_m: int, tile_n: int, source: bool) -> str:
    epilogue = EpilogueSchedule.TMA if schedule is KernelSchedule.PINGPONG else EpilogueSchedule.TMA_COOPERATIVE
    cfg = KernelConfig(tile_m=tile_m, tile_n=160, tile_k=64, cluster_m=1, cluster_n=1,
                       kernel_schedule=schedule, epilogue_schedule=epilogue, epilogue_source=source)
    text = render_unit([cfg]).source
    old = f"Shape<_{tile_m}, _160, _64>"
    assert text.count(old) == 1 and "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in text
    return text.replace(old, f"Shape<_{tile_m}, cute::Int<{tile_n}>, _64>")


def ptxas_report(log: str) -> tuple[int, int, int] | None:
    """(registers, spill store bytes, spill load bytes) of the GEMM kernel's entry."""
    entry = None
    spills = None
    for line in log.splitlines():
        if m := ENTRY.search(line):
            entry = m.group(1)
        elif entry and "GemmUniversal" in entry and (m := SPILLS.search(line)):
            spills = int(m.group(1)), int(m.group(2))
        elif entry and "GemmUniversal" in entry and spills and (m := USED.search(line)):
            return int(m.group(1)), *spills
    return None


def build(schedule: KernelSchedule, tile_m: int, tile_n: int, source: bool = False) -> str:
    toolchain = find_toolchain()
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "unit.cu"
        unit.write_text(unit_source(schedule, tile_m, tile_n, source))
        run = subprocess.run(toolchain.command(unit, Path(tmp) / "unit.so"), capture_output=True, text=True)
    label = f"{schedule.value} {tile_m}x{tile_n}{' with C' if source else ''}: {tile_n} accumulators per thread"
    if run.returncode:
        return f"{label}; nvcc exit {run.returncode}: {run.stderr.strip().splitlines()[-1]}"
    report = ptxas_report(run.stdout + run.stderr)
    if report is None:
        return f"{label}; no ptxas report for the GEMM kernel"
    regs, stores, loads = report
    return f"{label}; {regs} registers, spill stores {stores} B, spill loads {loads} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    jobs = parser.parse_args().jobs
    builds = [(KernelSchedule.PINGPONG, 128, n) for n in WIDTHS]
    builds.append((KernelSchedule.COOPERATIVE, 256, 208))
    builds += [(KernelSchedule.PINGPONG, 128, n, True) for n in (208, 224)]
    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(lambda b: build(*b), builds):
            print(line, flush=True)


if __name__ == "__main__":
    main()

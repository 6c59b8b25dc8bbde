"""Does CUTLASS build cuBLAS's 320x128 tile? (CPU only: nvcc, no GPU.)

cutlass-tune's rules stop tile M at 256, so this renders the cooperative 256x128x64 kernel
(cluster 1x2, no C operand), edits its tile to 320x128x64, compiles it with the driver's own
flags, and prints nvcc's outcome: the static_asserts that reject it, or "builds".

    python3 benchmarks/tile320_probe.py
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from cutlass_tune.compile import find_toolchain
from cutlass_tune.render import render_unit
from cutlass_tune.space import KernelConfig, KernelSchedule


def main() -> None:
    cfg = KernelConfig(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2,
                       kernel_schedule=KernelSchedule.COOPERATIVE, epilogue_source=False)
    source = render_unit([cfg]).source
    assert source.count("Shape<_256, _128, _64>") == 1, "the rendered tile shape moved"
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "unit.cu"
        unit.write_text(source.replace("Shape<_256, _128, _64>", "Shape<cute::Int<320>, _128, _64>"))
        run = subprocess.run(find_toolchain().command(unit, Path(tmp) / "unit.so"),
                             capture_output=True, text=True)
    asserts = sorted(set(re.findall(r'static assertion failed with "([^"]+)"', run.stderr)))
    print(f"320x128x64 cooperative 1x2: nvcc exit {run.returncode}; "
          + ("builds" if run.returncode == 0 else "static_asserts: " + "; ".join(asserts) if asserts
             else run.stderr.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()

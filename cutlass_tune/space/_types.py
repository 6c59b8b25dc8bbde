"""The values that describe a GEMM and a CUTLASS kernel for it: element types, layouts,
schedules and the other enums of the knobs, and `Problem`. The knobs themselves, and the
`KernelConfig` and `RuntimeArgs` that carry them, are declared in space/_knobs.py.
"""

from __future__ import annotations

import dataclasses
import enum


class DType(str, enum.Enum):
    """Element types. The value is the spelling used in config files and names."""

    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def bits(self) -> int:
        return {"bf16": 16, "f16": 16, "f32": 32, "e4m3": 8, "e5m2": 8}[self.value]

    @property
    def is_fp8(self) -> bool:
        return self in (DType.E4M3, DType.E5M2)


class Layout(str, enum.Enum):
    """Storage order of a matrix."""

    ROW = "row"
    COL = "col"


class KernelSchedule(str, enum.Enum):
    """CUTLASS SM90 mainloop kernel schedules."""

    TMA_WS = "tma_ws"  # KernelTmaWarpSpecialized: one consumer warpgroup, not persistent
    COOPERATIVE = "cooperative"  # KernelTmaWarpSpecializedCooperative
    PINGPONG = "pingpong"  # KernelTmaWarpSpecializedPingpong


class EpilogueSchedule(str, enum.Enum):
    """CUTLASS SM90 epilogue schedules."""

    TMA = "tma"  # TmaWarpSpecialized: pairs with pingpong and the plain kernel
    TMA_COOPERATIVE = "tma_cooperative"  # TmaWarpSpecializedCooperative: pairs with cooperative
    NO_SMEM = "no_smem"  # NoSmemWarpSpecialized: pairs with any schedule


class TileScheduler(str, enum.Enum):
    PERSISTENT = "persistent"
    STREAM_K = "stream_k"


class RasterOrder(enum.IntEnum):
    """Values match cutlass::gemm::kernel::detail::RasterOrderOptions."""

    HEURISTIC = 0
    ALONG_M = 1
    ALONG_N = 2


class Decomposition(enum.IntEnum):
    """Values match cutlass::gemm::kernel::detail::DecompositionMode."""

    HEURISTIC = 0
    DATA_PARALLEL = 1
    SPLIT_K = 2
    STREAM_K = 3


AUTO_STAGES = 0
"""`KernelConfig.stages` value meaning StageCountAutoCarveout."""

AUTO_EPILOGUE_TILE = 0
"""`KernelConfig.epilogue_tile_n` value meaning EpilogueTileAuto."""

PAIRED_EPILOGUE = {
    KernelSchedule.COOPERATIVE: EpilogueSchedule.TMA_COOPERATIVE,
    KernelSchedule.PINGPONG: EpilogueSchedule.TMA,
    KernelSchedule.TMA_WS: EpilogueSchedule.TMA,
}
"""The TMA epilogue each kernel schedule pairs with: what `epilogue_schedule: auto` means."""


def layout_code(layout_a: Layout, layout_b: Layout) -> str:
    """BLAS-style two-letter code, A then B: 't' row-major, 'n' column-major, with A seen as
    M x K and B as K x N; so "tn" has both operands K-major."""
    a = "t" if layout_a is Layout.ROW else "n"
    b = "n" if layout_b is Layout.COL else "t"
    return a + b


@dataclasses.dataclass(frozen=True)
class Problem:
    """One GEMM: D[M,N] = A[M,K] @ B[K,N], D row-major.

    `layout_b` is the storage of B seen as a K x N matrix: COL means each column (length K) is
    contiguous, i.e. B is stored as N x K row-major (the "TN" GEMM of nn.Linear).
    """

    m: int
    n: int
    k: int
    dtype_a: DType = DType.BF16
    dtype_b: DType = DType.BF16
    dtype_d: DType = DType.BF16
    layout_a: Layout = Layout.ROW
    layout_b: Layout = Layout.COL

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def name(self) -> str:
        return (
            f"{self.m}x{self.n}x{self.k}_{self.dtype_a.value}{self.dtype_b.value}"
            f"{self.dtype_d.value}_{layout_code(self.layout_a, self.layout_b)}"
        )

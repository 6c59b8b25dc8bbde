"""The values that describe a GEMM and a CUTLASS kernel for it: element types, layouts, scaling,
schedules and the other enums of the knobs. The epilogue and its activations are
space/_epilogue.py's. What a GEMM computes (`Operation`) and
`Problem` are in space/_operation.py; the knobs, and the `KernelConfig` and `RuntimeArgs` that
carry them, in space/_knobs.py.
"""

from __future__ import annotations

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


class Scaling(str, enum.Enum):
    """How an fp8 GEMM's accumulator is scaled, as `torch._scaled_mm` takes scales.

    TENSOR: one fp32 scale for A and one for B. ROWCOL: an fp32 vector of M scales for A's
    rows times one of N scales for B's columns (`scale_a` M x 1, `scale_b` 1 x N). BLOCKWISE
    (DeepSeek-V3's recipe): one fp32 scale per 1 x 128 group of A (a row's 128 consecutive K) and
    one per 128 x 128 block of B (N x K); `scale_a` M x K/128 with strides (1, M), `scale_b`
    K/128 x N/128 with strides (1, K/128), the transpose of the weight's contiguous N/128 x K/128
    scales. The mainloop applies them every 128 K, so the epilogue is the plain one's.
    """

    NONE = "none"
    TENSOR = "tensor"
    ROWCOL = "rowcol"
    BLOCKWISE = "blockwise"


class Grouping(str, enum.Enum):
    """Whether a GEMM is one matrix product or a group of them.

    GROUPED: the forward of MoE experts, as `torch._grouped_mm` takes it: A is the routed rows
    (M x K, rows sorted by expert), B one N x K weight per expert (E x N x K, or its K x N
    view), D the M x N outputs; group e multiplies A's rows `offsets[e-1]:offsets[e]` by
    expert e's weight. CUTLASS runs it as one ptr-array grouped kernel.

    GROUPED_K: the weight gradient of MoE experts, dW_e = G_e^T @ X_e, as torch's backward of
    `torch._grouped_mm` computes it (`torch._grouped_mm(g.t(), x, offs)`): G is the output
    gradient (M x N row-major), X the input (M x K row-major), both with rows sorted by expert,
    D one N x K gradient per expert (E x N x K row-major; E x K x N is the same problem with G
    and X swapped). Group e reduces over its rows `offsets[e-1]:offsets[e]`, so each group's
    GEMM is (N, K, M_e): the reduction dimension is ragged, N and K fixed. Its A, G_e^T, is
    M-major and its B, X_e, N-major (layout "nt"); an expert of no rows gets dW_e = 0.
    """

    NONE = "none"
    GROUPED = "grouped"
    GROUPED_K = "grouped-k"


class Routing(str, enum.Enum):
    """How a grouped problem's routed rows fall over its experts (`space.routed_rows`).

    UNIFORM: equal counts. ZIPF: expert i gets a share proportional to 1 / (i + 1) (Zipf, s=1).
    HISTOGRAM: the counts a real router produced, given with the problem.
    """

    UNIFORM = "uniform"
    ZIPF = "zipf"
    HISTOGRAM = "histogram"


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

"""The objects that describe a GEMM and a CUTLASS kernel for it.

Compile-time knobs (`KernelConfig`) make a new binary; run-time knobs (`RuntimeArgs`) are set
per launch on an existing binary. Keeping them apart is what lets one compile serve many
measurements.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any


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

_OMITTED_AT_DEFAULT = frozenset({"fp8_fast_accum", "epilogue_tile_n", "epilogue_source"})


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


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Everything that changes the compiled binary. Target: sm90a.

    Construct freely; `space.check_config` says whether CUTLASS can build it. Only configs with
    no rejection may be rendered.
    """

    dtype_a: DType = DType.BF16
    dtype_b: DType = DType.BF16
    dtype_c: DType = DType.BF16
    dtype_d: DType = DType.BF16
    dtype_acc: DType = DType.F32
    layout_a: Layout = Layout.ROW
    layout_b: Layout = Layout.COL
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    cluster_m: int = 1
    cluster_n: int = 1
    stages: int = AUTO_STAGES
    kernel_schedule: KernelSchedule = KernelSchedule.COOPERATIVE
    epilogue_schedule: EpilogueSchedule = EpilogueSchedule.TMA_COOPERATIVE
    tile_scheduler: TileScheduler = TileScheduler.PERSISTENT
    arch: str = "sm90a"
    fp8_fast_accum: bool = False
    """fp8 only: the FP8FastAccum schedule, which accumulates the whole K loop inside the
    tensor core's reduced-precision accumulator instead of promoting to fp32 every 4 k-steps."""
    epilogue_tile_n: int = AUTO_EPILOGUE_TILE
    """Columns of the TMA epilogue's subtile (its rows are fixed: 64, or 128 for cooperative);
    AUTO_EPILOGUE_TILE lets CUTLASS choose (32 for 16-bit outputs)."""
    epilogue_source: bool = True
    """False builds a kernel with no C operand (ElementC void): D = alpha * A @ B only. Its
    epilogue keeps no shared-memory buffers for C and issues its TMA stores without waiting
    for C loads. Every launch cutlass-tune makes has beta = 0, so both kinds serve it."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (enum values as strings); inverse of `from_dict`.

        Fields added after a config's hash was first published (`_OMITTED_AT_DEFAULT`) are left
        out while they hold their default, so those hashes, and the stores keyed by them, stay
        valid."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in _OMITTED_AT_DEFAULT and type(v) is type(f.default) and v == f.default:
                continue
            out[f.name] = v.value if isinstance(v, enum.Enum) else v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelConfig:
        """Build from `to_dict` output (a field it omits takes its default). Raises
        ValueError/TypeError on unknown keys or values."""
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = set(data) - set(kinds)
        if unknown:
            raise ValueError(f"unknown KernelConfig fields: {sorted(unknown)}")
        enums = {
            "dtype_a": DType, "dtype_b": DType, "dtype_c": DType, "dtype_d": DType,
            "dtype_acc": DType, "layout_a": Layout, "layout_b": Layout,
            "kernel_schedule": KernelSchedule, "epilogue_schedule": EpilogueSchedule,
            "tile_scheduler": TileScheduler,
        }
        values = {k: (enums[k](v) if k in enums else v) for k, v in data.items()}
        return cls(**values)

    @property
    def hash(self) -> str:
        """Content hash of the config (hex, 16 chars); stable across processes and versions."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def name(self) -> str:
        """Stable human-readable name, e.g. `bf16_tn_128x256x64_c2x1_sauto_cooperative_tma_cooperative_persistent`
        (`_fastaccum` appended for fp8 fast accumulation, `_e64` for a 64-column epilogue
        subtile, `_nosrc` for a kernel without a C operand)."""
        types = self.dtype_a.value
        if self.dtype_b != self.dtype_a:
            types += self.dtype_b.value
        if self.dtype_d != self.dtype_a or self.dtype_c != self.dtype_d:
            types += f"_{self.dtype_c.value}{self.dtype_d.value}"
        if self.dtype_acc != DType.F32:
            types += f"_acc{self.dtype_acc.value}"
        stages = "auto" if self.stages == AUTO_STAGES else str(self.stages)
        return (
            f"{types}_{layout_code(self.layout_a, self.layout_b)}"
            f"_{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}"
            f"_s{stages}_{self.kernel_schedule.value}_{self.epilogue_schedule.value}"
            f"_{self.tile_scheduler.value}{'_fastaccum' if self.fp8_fast_accum is True else ''}"
            f"{f'_e{self.epilogue_tile_n}' if self.epilogue_tile_n != AUTO_EPILOGUE_TILE else ''}"
            f"{'_nosrc' if self.epilogue_source is False else ''}"
        )


@dataclasses.dataclass(frozen=True)
class RuntimeArgs:
    """Run-time knobs of a compiled kernel, set in `Arguments::scheduler`.

    `splits` and `decomposition` mean something only for Stream-K kernels; leave the defaults
    for others.
    """

    raster: RasterOrder = RasterOrder.HEURISTIC
    swizzle: int = 1
    splits: int = 1
    decomposition: Decomposition = Decomposition.HEURISTIC

    @property
    def name(self) -> str:
        s = f"r{self.raster.name.lower()}_sw{self.swizzle}"
        if self.splits != 1 or self.decomposition != Decomposition.HEURISTIC:
            s += f"_sp{self.splits}_{self.decomposition.name.lower()}"
        return s

"""The tuned matmul: run the best kernel of a best-config table on torch tensors.

Conventions (those of `Problem`): `a` is M x K and `b` is K x N, D = a @ b is returned M x N
row-major. Each operand may be row- or column-major: `b = w.t()` of a contiguous N x K weight
is the "tn" case of nn.Linear. Kernels are compiled on demand from the kernel cache (a cache
hit when the sweep ran on this machine), or taken from the table's bundle (`cutlass-tune
export`: no compiler needed), and loaded once per process.

fp8 (torch.float8_e4m3fn) inputs must be "tn" and give a bfloat16 D (unless the kernel says
otherwise), computed with unit scales: scale the result yourself. Where no tuned kernel can
run them, torch._scaled_mm does.
"""

from __future__ import annotations

import collections
import functools
import json
import threading
import warnings
from pathlib import Path

import torch

from ..compile import KernelCache, compile_kernels
from ..errors import CutlassTuneError
from ..space import DType, KernelConfig, Layout, Problem, RuntimeArgs, TileScheduler, check_problem, layout_code
from ..status import Status
from ..tables import BestTableError, BundledKernel
from ._context import bind_primary_context
from ._kernel import GemmArgs, KernelStatusError, LoadedKernel, make_args
from ._table import BestTable

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16, torch.float8_e4m3fn: DType.E4M3}
# Not e5m2: with both inputs e5m2, torch._scaled_mm (the fallback where no kernel applies) has no GEMM.
_TORCH = {DType.BF16: torch.bfloat16, DType.F16: torch.float16, DType.F32: torch.float32}
_OUT_DTYPES = {t: d for d, t in _TORCH.items()}
_FP8_OUT = DType.BF16
READY_INSTANCES = 32
"""Initialized kernel instances a `Gemm` keeps per thread, by problem and addresses: a model's
layers call one kernel on a few recurring buffers, each then launched without initializing."""


class MatmulInputError(CutlassTuneError, ValueError):
    """Tensors the tuned kernels cannot take (device, dtype, shape, layout, alignment)."""


def _layout(t: torch.Tensor, name: str, rows_major: Layout, cols_major: Layout) -> Layout:
    r, c = t.shape
    if t.stride() == (c, 1) or c == 1:
        return rows_major
    if t.stride() == (1, r) or r == 1:
        return cols_major
    raise MatmulInputError(f"{name} {tuple(t.shape)} with strides {t.stride()} is neither row- nor "
                           "column-major contiguous: call .contiguous() first")


def problem_of(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> Problem:
    """The `Problem` two tensors pose. Raises MatmulInputError with what to fix."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.device.type != "cuda":
            raise MatmulInputError(f"{name} is on {t.device}: the tuned kernels run on a CUDA device")
        if t.dim() != 2:
            raise MatmulInputError(f"{name} must be 2-D, not {t.dim()}-D")
        if t.dtype not in _DTYPES:
            raise MatmulInputError(f"{name} has dtype {t.dtype}; the tuned kernels take bfloat16, float16 "
                                   "or float8_e4m3fn")
        if t.data_ptr() % 16:
            raise MatmulInputError(f"{name} starts at an address that is not 16-byte aligned (TMA needs it)")
    if a.dtype != b.dtype:
        raise MatmulInputError(f"a is {a.dtype} and b is {b.dtype}: they must match")
    if a.device != b.device:
        raise MatmulInputError(f"a is on {a.device} and b on {b.device}")
    if a.shape[1] != b.shape[0]:
        raise MatmulInputError(f"a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    dtype = _DTYPES[a.dtype]
    default = _FP8_OUT if dtype.is_fp8 else dtype
    out = _OUT_DTYPES.get(out_dtype) if out_dtype is not None else default
    if out is None:
        raise MatmulInputError(f"out_dtype {out_dtype} is not supported (bfloat16, float16, float32)")
    problem = Problem(a.shape[0], b.shape[1], a.shape[1], dtype, dtype, out,
                      _layout(a, "a", Layout.ROW, Layout.COL), _layout(b, "b", Layout.ROW, Layout.COL))
    why = check_problem(problem)
    if why:
        raise MatmulInputError(f"{problem.m}x{problem.n}x{problem.k}: {why[0].reason}")
    return problem


class Gemm:
    """One tuned kernel, compiled (or taken from the cache) and loaded once. Thread-safe.

    Args:
        config: the kernel to run; `runtime`: its run-time variant.
        cache_dir: kernel cache (default: `settings.cache_dir()`).
        bundled: the kernel's library in a bundle: loaded as it is, nothing compiled.

    Raises:
        CutlassTuneError: the kernel does not compile (with the compiler's reason).
        KernelLoadError: the library cannot be loaded.
    """

    def __init__(self, config: KernelConfig, runtime: RuntimeArgs = RuntimeArgs(), cache_dir: Path | None = None,
                 bundled: BundledKernel | None = None):
        if bundled is None:
            compiled = compile_kernels([config], cache=KernelCache.at(cache_dir), jobs=1)[0]
            if compiled.status is not Status.OK or compiled.library is None:
                raise CutlassTuneError(f"{config.name} does not compile: {compiled.reason} (log {compiled.log_path})")
            library, symbol = compiled.library, compiled.symbol
        else:
            library, symbol = bundled.library, bundled.symbol
        self.config, self.runtime = config, runtime
        self.kernel = LoadedKernel(library, symbol)
        self._local = threading.local()
        self._stream_k = config.tile_scheduler is TileScheduler.STREAM_K
        self._dtype_d = _TORCH[config.dtype_d]

    def __call__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """D = a @ b with this kernel. Raises MatmulInputError for tensors it cannot take,
        KernelStatusError when CUTLASS refuses the problem."""
        problem = problem_of(a, b, self._dtype_d)
        if (problem.layout_a, problem.layout_b) != (self.config.layout_a, self.config.layout_b):
            raise MatmulInputError(f"this kernel is {layout_code(self.config.layout_a, self.config.layout_b)}; "
                                   f"the tensors are {layout_code(problem.layout_a, problem.layout_b)}")
        return self.run(problem, a, b, out)

    def run(self, problem: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Launch on tensors already checked to pose `problem` (the fast path of `matmul`)."""
        if out is None:
            out = torch.empty(problem.m, problem.n, dtype=self._dtype_d, device=a.device)
        elif out.shape != (problem.m, problem.n) or not out.is_contiguous() or out.dtype != self._dtype_d:
            raise MatmulInputError(f"out must be a contiguous {problem.m}x{problem.n} {self._dtype_d} tensor")
        device = a.device.index if a.device.index is not None else torch.cuda.current_device()
        stream = _current_stream(device)
        key = (problem, device, a.data_ptr(), b.data_ptr(), out.data_ptr(), stream)
        ready: collections.OrderedDict = self._local.__dict__.setdefault("ready", collections.OrderedDict())
        instance = ready.get(key)
        if instance is not None and not self._stream_k:
            ready.move_to_end(key)
        else:
            # initialize() builds the TMA descriptors (they hold the addresses) and zeroes the
            # workspace: once per (problem, addresses, stream) this thread has seen lately (a
            # model's steady stream reuses its buffers), and before every Stream-K launch (its
            # workspace barriers must start at zero).
            bind_primary_context(device)
            args = make_args(problem, self.runtime, a=key[2], b=key[3], d=key[4], device_id=device,
                             sm_count=_sm_count(device))
            if instance is None:
                instance = self.kernel.create()
                ready[key] = instance
                if len(ready) > READY_INSTANCES:
                    ready.popitem(last=False)[1].close()
            workspace = self._workspace(problem, device, args)
            instance.initialize(args, 0 if workspace is None else workspace.data_ptr(), stream)
        instance.run(stream)  # after the launch is enqueued a temporary workspace may go back to torch
        return out

    def _workspace(self, problem: Problem, device: int, args: GemmArgs) -> torch.Tensor | None:
        """The workspace of a launch for `problem` on `device`: none where the kernel needs none;
        for a Stream-K kernel (initialized before every launch) a temporary from torch on the
        current stream, so each launch a CUDA graph captures has its own, in the graph's pool;
        else this thread's, kept (its instances launch one after another on its stream).

        A workspace kept past a call that torch.compile's CUDA graphs warm up or record would
        sit in their memory pool untracked, which they refuse: kernels of no workspace keep none.
        """
        sizes = self._local.__dict__.setdefault("workspace_sizes", {})
        size = sizes.get((problem, device))
        if size is None:
            size = sizes[(problem, device)] = self.kernel.workspace_size(args)
        if size == 0:
            return None
        cuda = torch.device("cuda", device)
        if self._stream_k:
            return torch.empty(size, dtype=torch.uint8, device=cuda)
        kept = self._local.__dict__.setdefault("workspaces", {})
        found = kept.get((problem, device))
        if found is None:
            found = kept[(problem, device)] = torch.empty(size, dtype=torch.uint8, device=cuda)
        return found


def _current_stream(device: int) -> int:
    """The handle of the current CUDA stream of `device`: torch's raw accessor where the build
    has it (no Stream object per call), else the public one."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _untuned_name(problem: Problem) -> str:
    return "torch._scaled_mm" if problem.dtype_a.is_fp8 else "torch.matmul"


def torch_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """What `matmul` runs where no tuned kernel can: torch's own GEMM for the same inputs and
    output type."""
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        one = torch.ones((), dtype=torch.float32, device=a.device)
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype)
    if out_dtype == a.dtype:
        return torch.matmul(a, b)
    return torch.mm(a, b, out_dtype=out_dtype)


@functools.cache
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _gemm(config_json: str, runtime: RuntimeArgs, bundled: BundledKernel | None) -> Gemm:
    return Gemm(KernelConfig.from_dict(json.loads(config_json)), runtime, bundled=bundled)


_warned: set[str] = set()


def matmul(a: torch.Tensor, b: torch.Tensor, table: BestTable | str | Path,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a @ b through the best kernel the table has for this problem.

    `out_dtype` is the type of the result: by default the inputs' type for bfloat16 and
    float16, bfloat16 for fp8; torch.float32 (or another 16-bit type) picks the table's kernels
    with that output. The first call for a shape looks the problem up and loads its kernel;
    later calls with the same shapes, strides and dtypes go straight to the launch (a table
    loaded from a path is kept per path).

    An exact entry runs its kernel; a problem that was not tuned runs the kernel of the nearest
    tuned problem of the same dtypes and layout (every kernel is correct for every aligned
    shape; only its speed was measured elsewhere). Where the table has nothing for the dtypes
    and layout, or CUTLASS cannot implement the problem, it falls back to torch's own GEMM
    (torch.matmul, or torch.mm with `out_dtype`; for fp8, torch._scaled_mm with unit scales)
    and warns once per cause.

    Raises:
        MatmulInputError: operands that are not tensors, CPU tensors, unsupported dtypes,
            misaligned or non-contiguous tensors.
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        problem_of(a, b)  # raises, naming the operand that is not a tensor and its type
    table = table if isinstance(table, BestTable) else _load_table(str(table))
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, out_dtype)
    cached = table._kernels.get(key)
    if cached is not None and a.device.type == "cuda" and b.device == a.device \
            and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0:
        gemm, problem = cached
        return torch_gemm(a, b, _TORCH[problem.dtype_d]) if gemm is None else gemm.run(problem, a, b)
    problem = problem_of(a, b, out_dtype)
    code = layout_code(problem.layout_a, problem.layout_b)
    dtypes = f"{problem.dtype_a.value} -> {problem.dtype_d.value} {code}"
    try:
        match = table.lookup(problem.m, problem.n, problem.k, problem.dtype_a.value, code, problem.dtype_d.value)
    except BestTableError as err:
        _warn_once(dtypes, f"cutlass_tune.matmul: {err}; using {_untuned_name(problem)}")
        table._kernels[key] = (None, problem)
        return torch_gemm(a, b, _TORCH[problem.dtype_d])
    bundled = table.bundled.get(match.row["config_hash"]) if table.bundled else None
    gemm = _gemm(match.row["config"], match.runtime, bundled)
    try:
        result = gemm.run(problem, a, b)
    except KernelStatusError as err:
        _warn_once(match.row["kernel"], f"cutlass_tune.matmul: {match.row['kernel']} cannot run "
                   f"{problem.name} ({err}); using {_untuned_name(problem)}")
        table._kernels[key] = (None, problem)
        return torch_gemm(a, b, _TORCH[problem.dtype_d])
    table._kernels[key] = (gemm, problem)
    return result


@functools.lru_cache(maxsize=8)
def _load_table(source: str) -> BestTable:
    return BestTable.load(source)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

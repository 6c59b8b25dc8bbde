"""The tuned matmul: run the best kernel of a best-config table on torch tensors.

Conventions (those of `Problem`): `a` is M x K and `b` is K x N, D = a @ b is returned M x N
row-major. Each operand may be row- or column-major: `b = w.t()` of a contiguous N x K weight
is the "tn" case of nn.Linear. Kernels are compiled on demand from the kernel cache (a cache
hit when the sweep ran on this machine), or taken from the table's bundle (`cutlass-tune
export`: no compiler needed), and loaded once per process.

A fused epilogue is part of the call: D = activation(s * (a @ b) + beta * c + bias), with
`bias` one value per output column (nn.Linear's), `c` an M x N residual, s = alpha (for fp8,
times `scale_a` and `scale_b` as torch._scaled_mm takes them: one value each, or M x 1 and 1 x N).
Gated (`gate`, M x N, instead of `c`): D = activation(gate) * (s * (a @ b) + bias), the up
projection of a gated MLP whose gate GEMM's output is `gate`; the kernel reads it as its C.
The table's rows for exactly that epilogue and scaling run it; where it has none, torch computes
the same math (`torch_gemm`): results are always right, only their speed depends on the table.

fp8 (torch.float8_e4m3fn) inputs must be "tn" and give a bfloat16 D (unless the kernel says
otherwise); without scales they are computed with unit scales. Where no tuned kernel can run
them, torch._scaled_mm does.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch._C._autograd import _profiler_enabled
from torch.utils.weak import WeakIdKeyDictionary

from .._torch import BLOCKWISE_GROUP, FP8_DTYPES, TORCH_DTYPE, apply_nodes, blockwise_mm, expand_blockwise_scale_b
from ..errors import CutlassTuneError
from ..kernel import GemmArgs, KernelStatusError, LoadedKernel, bind_primary_context, make_args
from ..measurement import LT_ACTIVATIONS
from ..space import (
    Activation,
    DType,
    Epilogue,
    KernelConfig,
    Layout,
    Node,
    NodeKind,
    Problem,
    RuntimeArgs,
    Scaling,
    TileScheduler,
    check_problem,
)
from ..status import Status
from ..tables import PROFILER_RANGE, BundledKernel
from . import _native
from ._dispatch import (
    KERNEL_CLASSES,
    OUT_DTYPES,
    Call,
    Kind,
    Plan,
    Ready,
    Workspace,
    cannot_implement,
    current_stream,
    load_table,
    prepare,
    sm_count,
)
from ._table import BestTable

if TYPE_CHECKING:
    from ._grouped import GroupedLaunch

_DTYPES = {TORCH_DTYPE[d]: d for d in (DType.BF16, DType.F16, DType.E4M3)}
# Not e5m2: with both inputs e5m2, torch._scaled_mm (the fallback where no kernel applies) has no GEMM.
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


_ACTIVATIONS = {a.value: a for a in Activation}


def activation_of(value: object) -> Activation:
    """An `Activation` given as itself or its name ("silu", "gelu_tanh", ...). Raises
    MatmulInputError naming the known ones."""
    if isinstance(value, Activation):
        return value
    found = _ACTIVATIONS.get(value) if isinstance(value, str) else None
    if found is not None:
        return found
    known = ", ".join(a.value for a in Activation)
    raise MatmulInputError(f"activation {str(value)[:40]!r} is not one of {known}")


def _tensor(t: object, name: str) -> torch.Tensor | None:
    if t is not None and not isinstance(t, torch.Tensor):
        raise MatmulInputError(f"{name} must be a torch.Tensor or None, not {type(t).__name__}")
    return t


def _check_operand(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                   what: str) -> None:
    """`t` is `shape` of `dtype` on `device` and contiguous, or a MatmulInputError saying
    which it is not."""
    if tuple(t.shape) != shape:
        raise MatmulInputError(f"{name} has shape {tuple(t.shape)}; it must be {shape} ({what})")
    if t.dtype != dtype:
        raise MatmulInputError(f"{name} has dtype {t.dtype}; it must be {dtype} ({what})")
    if t.device != device:
        raise MatmulInputError(f"{name} is on {t.device} and a on {device}")
    if not t.is_contiguous():
        raise MatmulInputError(f"{name} with strides {t.stride()} is not contiguous: call .contiguous() first")


def _blockwise_shapes(a: torch.Tensor, n: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> bool:
    """Whether the scales have torch._scaled_mm's block-wise shapes for a (M x K) times a K x N:
    (M, K/128) and (K/128, N/128), rounded up, and are not (M, 1) and (1, N) (row-wise)."""
    m, k = a.shape
    groups = -(-k // BLOCKWISE_GROUP)
    return (tuple(scale_a.shape) == (m, groups) and tuple(scale_b.shape) == (groups, -(-n // BLOCKWISE_GROUP))
            and tuple(scale_b.shape) != (1, n))


def _check_blockwise(t: torch.Tensor, name: str, strides: tuple[int, int], device: torch.device, what: str) -> None:
    """A block-wise scale's type, device and strides (a dimension of size 1 takes any stride, as in torch)."""
    if t.dtype != torch.float32:
        raise MatmulInputError(f"{name} has dtype {t.dtype}; it must be torch.float32 ({what})")
    if t.device != device:
        raise MatmulInputError(f"{name} is on {t.device} and a on {device}")
    if any(size > 1 and stride != want for size, stride, want in zip(t.shape, t.stride(), strides)):
        raise MatmulInputError(f"{name} with strides {t.stride()} must have strides {strides} ({what})")


def _looks_blockwise(m: int, n: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> bool:
    """Whether scales that are neither shaped block-wise nor row-wise were meant block-wise:
    a scale_a of more than one column, a scale_b of more than one row (row-wise ones are (M, 1)
    and (1, N)), or a scale_b of one row of N/128 blocks (K taken as one group)."""
    n_blocks = -(-n // BLOCKWISE_GROUP)
    return ((scale_a.dim() == 2 and scale_a.shape[1] != 1) or (scale_b.dim() == 2 and scale_b.shape[0] != 1)
            or (tuple(scale_b.shape) == (1, n_blocks) and n_blocks != n))


def k_not_whole(k: int) -> str:
    """What a block-wise scale error adds where K is the cause: "" for K a multiple of 128."""
    return "" if k % BLOCKWISE_GROUP == 0 else (f"; K {k} is not a multiple of {BLOCKWISE_GROUP}: block-wise "
                                                f"scaling needs K a multiple of {BLOCKWISE_GROUP}")


def _refuse_blockwise_shapes(a: torch.Tensor, n: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> None:
    """A MatmulInputError naming the block-wise scale of the wrong shape, and K where it is
    not a multiple of 128 (K/128 is then where the shapes went wrong)."""
    m, k = a.shape
    groups, n_blocks = -(-k // BLOCKWISE_GROUP), -(-n // BLOCKWISE_GROUP)
    whole = k_not_whole(k)
    if tuple(scale_a.shape) != (m, groups):
        raise MatmulInputError(f"scale_a has shape {tuple(scale_a.shape)}; block-wise it must be ({m}, {groups}): "
                               f"(M, K/128 rounded up), one per 1 x {BLOCKWISE_GROUP} group of a{whole}")
    raise MatmulInputError(f"scale_b has shape {tuple(scale_b.shape)}; block-wise it must be ({groups}, {n_blocks}): "
                           f"(K/128, N/128 rounded up), one per {BLOCKWISE_GROUP} x {BLOCKWISE_GROUP} block of b"
                           f"{whole}")


def _scaling_of(a: torch.Tensor, m: int, n: int, scale_a: torch.Tensor | None,
                scale_b: torch.Tensor | None) -> Scaling:
    """The scaling the scales pose (checked as torch._scaled_mm takes them)."""
    if scale_a is None and scale_b is None:
        return Scaling.NONE
    if a.dtype not in FP8_DTYPES:
        raise MatmulInputError(f"scale_a and scale_b scale fp8 inputs; a and b are {a.dtype} (use alpha)")
    if scale_a is None or scale_b is None:
        raise MatmulInputError(f"{'scale_b' if scale_a is not None else 'scale_a'} is missing: "
                               "pass both scales or neither")
    if scale_a.numel() == 1 and scale_b.numel() == 1 and scale_a.dim() <= 2 and scale_b.dim() <= 2:
        for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
            _check_operand(t, name, tuple(t.shape), torch.float32, a.device, "a per-tensor scale")
        return Scaling.TENSOR
    if not _blockwise_shapes(a, n, scale_a, scale_b) and _looks_blockwise(m, n, scale_a, scale_b):
        _refuse_blockwise_shapes(a, n, scale_a, scale_b)
    if _blockwise_shapes(a, n, scale_a, scale_b):
        groups = scale_b.shape[0]
        _check_blockwise(scale_a, "scale_a", (1, m), a.device, "one per 1 x 128 group of a: (M, K/128) "
                         "outer-dim-major, as torch._scaled_mm takes it (s.t().contiguous().t())")
        _check_blockwise(scale_b, "scale_b", (1, groups), a.device, "one per 128 x 128 block of b: "
                         "(K/128, N/128), the transpose of the weight's contiguous (N/128, K/128)")
        return Scaling.BLOCKWISE
    _check_operand(scale_a, "scale_a", (m, 1), torch.float32, a.device,
                   "one value per row of a, or a single value with a single scale_b")
    _check_operand(scale_b, "scale_b", (1, n), torch.float32, a.device,
                   "one value per column of b, or a single value with a single scale_a")
    return Scaling.ROWCOL


def operation_of(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, *, bias: torch.Tensor | None = None,
                 activation: Activation | str = Activation.NONE, c: torch.Tensor | None = None,
                 scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
                 gate: torch.Tensor | None = None) -> tuple[Epilogue, Scaling]:
    """The epilogue and scaling of a call of 2-D `a` (M x K) and `b` (K x N) with these
    operands, each checked on any device: `bias` (N,), `c` and `gate` (M, N; not both) of
    `out_dtype`, the scales float32 as torch._scaled_mm takes them (fp8 inputs only), all
    contiguous and on a's device.

    Raises:
        MatmulInputError: one line naming the operand and what to fix.
    """
    m, n = a.shape[0], b.shape[1]
    bias, c, gate = _tensor(bias, "bias"), _tensor(c, "c"), _tensor(gate, "gate")
    scale_a, scale_b = _tensor(scale_a, "scale_a"), _tensor(scale_b, "scale_b")
    if c is not None and gate is not None:
        raise MatmulInputError("c and gate are both read as the kernel's C: pass one (a residual or a gate)")
    if bias is not None:
        _check_operand(bias, "bias", (n,), out_dtype, a.device, "one value per output column, of the result's dtype")
    if c is not None:
        _check_operand(c, "c", (m, n), out_dtype, a.device, "the residual, M x N row-major of the result's dtype")
    if gate is not None:
        _check_operand(gate, "gate", (m, n), out_dtype, a.device,
                       "the gate's pre-activation, M x N row-major of the result's dtype")
    scaling = _scaling_of(a, m, n, scale_a, scale_b)
    return Epilogue(bias=bias is not None, activation=activation_of(activation), residual=c is not None,
                    gated=gate is not None), scaling


def problem_of(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None, *,
               bias: torch.Tensor | None = None, activation: Activation | str = Activation.NONE,
               c: torch.Tensor | None = None, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> Problem:
    """The `Problem` the tensors of a `matmul` call pose, its epilogue and scaling included.
    Raises MatmulInputError with what to fix."""
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
    out = OUT_DTYPES.get(out_dtype) if out_dtype is not None else default
    if out is None:
        raise MatmulInputError(f"out_dtype {out_dtype} is not supported (bfloat16, float16, float32)")
    epilogue, scaling = operation_of(a, b, TORCH_DTYPE[out], bias=bias, activation=activation, c=c, scale_a=scale_a,
                                     scale_b=scale_b, gate=gate)
    for name, operand in (("bias", bias), ("c", c), ("gate", gate), ("scale_a", scale_a), ("scale_b", scale_b)):
        if operand is not None and operand.data_ptr() % 16:
            raise MatmulInputError(f"{name} starts at an address that is not 16-byte aligned (the kernels read it "
                                   "by vectors): call .clone() first")
    problem = Problem(a.shape[0], b.shape[1], a.shape[1], dtype_a=dtype, dtype_b=dtype, dtype_d=out,
                      layout_a=_layout(a, "a", Layout.ROW, Layout.COL),
                      layout_b=_layout(b, "b", Layout.ROW, Layout.COL), epilogue=epilogue, scaling=scaling)
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
            # Imported here: a serving host that runs bundled kernels needs no compiler.
            from ..compile import KernelCache, compile_kernels

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
        self._dtype_d = TORCH_DTYPE[config.dtype_d]

    def template(self, problem: Problem, device: int) -> tuple[GemmArgs, int]:
        """The launch arguments of `problem` on CUDA device `device` with every address zero and
        alpha 1 (a `Plan`'s), and the workspace the kernel needs for them in bytes."""
        args = make_args(problem, self.runtime, a=0, b=0, d=0, device_id=device, sm_count=sm_count(device))
        return args, self.kernel.workspace_size(args)

    def workspace_policy(self, size: int, keep: bool = True) -> Workspace:
        """Where a launch's workspace of `size` bytes comes from (see `Gemm.run`)."""
        if size == 0:
            return Workspace.NONE
        return Workspace.PER_CALL if self._stream_k else Workspace.KEPT

    def launch_of(self, plan: Plan) -> GroupedLaunch | None:
        """What a launch of `plan` keeps beside the plan (a grouped kernel's `GroupedLaunch`)."""
        return None

    def __call__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                 bias: torch.Tensor | None = None, c: torch.Tensor | None = None, scale_a: torch.Tensor | None = None,
                 scale_b: torch.Tensor | None = None, alpha: float = 1.0, beta: float | None = None,
                 gate: torch.Tensor | None = None) -> torch.Tensor:
        """D = epilogue(a @ b) with this kernel, its epilogue's operands (`bias`, `c` or `gate`,
        the fp8 scales) as `matmul` takes them. Raises MatmulInputError for tensors it cannot take or
        an epilogue that is not the kernel's, KernelStatusError when CUTLASS refuses the problem."""
        problem = problem_of(a, b, self._dtype_d, bias=bias, activation=self.config.epilogue.activation, c=c,
                             scale_a=scale_a, scale_b=scale_b, gate=gate)
        if problem.layout != self.config.layout:
            raise MatmulInputError(f"this kernel is {self.config.layout}; the tensors are {problem.layout}")
        if problem.operation != self.config.operation:
            raise MatmulInputError(f"this kernel computes {self.config.words}; the call asks for {problem.words}")
        return self.run(problem, a, b, out, bias=bias, c=c if gate is None else gate, scale_a=scale_a,
                        scale_b=scale_b, alpha=alpha, beta=beta_of(c, beta))

    def run(self, problem: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
            bias: torch.Tensor | None = None, c: torch.Tensor | None = None, scale_a: torch.Tensor | None = None,
            scale_b: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
        """Launch on tensors already checked to pose `problem`, its epilogue's operands
        included (the fast path of `matmul`); `c` is the kernel's C, a gated problem's gate."""
        if out is None:
            out = torch.empty(problem.epilogue.output_shape(problem.m, problem.n), dtype=self._dtype_d,
                              device=a.device)
        elif out.shape != problem.epilogue.output_shape(problem.m, problem.n) or not out.is_contiguous() \
                or out.dtype != self._dtype_d:
            raise MatmulInputError(f"out must be a contiguous {problem.m}x{problem.n} {self._dtype_d} tensor")
        device = a.device.index if a.device.index is not None else torch.cuda.current_device()
        stream = current_stream(device)
        scale_b = self.kernel_scale_b(scale_b, problem.n)
        operands = tuple(0 if t is None else t.data_ptr() for t in (c, bias, scale_a, scale_b))
        key = (problem, device, a.data_ptr(), b.data_ptr(), out.data_ptr(), stream, operands, alpha, beta)
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
                             sm_count=sm_count(device), c=operands[0] or None, bias=operands[1] or None,
                             scale_a=operands[2] or None, scale_b=operands[3] or None, alpha=alpha, beta=beta)
            if instance is None:
                instance = self.kernel.create()
                ready[key] = instance
                if len(ready) > READY_INSTANCES:
                    ready.popitem(last=False)[1].close()
            workspace = self._workspace(problem, device, args)
            instance.initialize(args, 0 if workspace is None else workspace.data_ptr(), stream)
        instance.run(stream)  # after the launch is enqueued a temporary workspace may go back to torch
        return out

    def kernel_scale_b(self, scale_b: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """`scale_b` as this kernel reads it: itself, or, for a block-wise kernel of `scale_n`
        below 128, its expansion to that granularity (`expand_blockwise_scale_b`, N = `n`).

        The expansion is kept per scale tensor (a weight's, reused every call) and per thread,
        weakly: it lives as long as the tensor. It is made again when the tensor was written in
        place (its version counter moved). It is made per call, and not kept, for a tensor with
        no version counter (made under torch.inference_mode: a write could not be seen).

        During CUDA graph capture a kept, current expansion is what the graph reads (no copy
        kernel in it; a call before the capture, as graph warm-up makes, keeps one): scales
        written in place after the capture reach its replays only once captured again. Without
        one, the expansion is captured with the kernel and not kept (kept, it would sit in the
        graph's memory pool untracked)."""
        if scale_b is None or self.config.scale_n == BLOCKWISE_GROUP:
            return scale_b
        scale_n = self.config.scale_n
        if scale_b.is_inference():
            return expand_blockwise_scale_b(scale_b, n, scale_n)
        kept = self._local.__dict__.setdefault("scale_b", WeakIdKeyDictionary())
        entry = kept.get(scale_b)
        if entry is not None and entry[0] == (scale_b._version, n):
            return entry[1]
        expanded = expand_blockwise_scale_b(scale_b, n, scale_n)
        if not (scale_b.is_cuda and torch.cuda.is_current_stream_capturing()):
            kept[scale_b] = ((scale_b._version, n), expanded)
        return expanded

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


KERNEL_CLASSES[Kind.DENSE] = Gemm


def beta_of(c: torch.Tensor | None, beta: float | None) -> float:
    """beta as the kernel takes it: 1 with a residual unless given, 0 without one."""
    if c is None:
        if beta is not None and beta != 0:
            raise MatmulInputError(f"beta {beta} scales c, and no c was given")
        return 0.0
    return 1.0 if beta is None else float(beta)


def _product(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """torch's GEMM of 16-bit inputs into `out_dtype`. Off CUDA a type other than the inputs'
    is computed in float32 and cast (torch.mm has no out_dtype there)."""
    if out_dtype == a.dtype:
        return torch.matmul(a, b)
    if a.device.type == "cuda":
        return torch.mm(a, b, out_dtype=out_dtype)
    return torch.matmul(a.float(), b.float()).to(out_dtype)


def torch_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, *, bias: torch.Tensor | None = None,
               activation: Activation | str = Activation.NONE, c: torch.Tensor | None = None, alpha: float = 1.0,
               beta: float = 0.0, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, gate: torch.Tensor | None = None,
               fast_accum: bool = False) -> torch.Tensor:
    """What `matmul` runs where no tuned kernel can or should: torch's own path for the same math
    (activation(s * (a @ b) + beta * c + bias), or with a `gate` activation(gate) * (s * (a @ b)
    + bias)), inputs and output type, on any device.

    fp8: torch._scaled_mm with the scales (unit scales where none are given; alpha folded into
    scale_a) and the bias, with `fast_accum` its fast accumulation (per-tensor and row-wise
    scales; the block-wise path has none). 16-bit: a bias alone is F.linear's call (torch.addmm:
    cuBLASLt's bias epilogue), with ReLU or tanh GELU on CUDA cuBLASLt's own epilogue
    (torch._addmm_activation: the fastest torch path for them), a residual torch.addmm's beta, then
    the activation as torch computes it; gated, the activation of the gate times that product.
    What the GEMM call does not fold in, the epilogue tree's remaining nodes apply as their
    facets say (`_torch.NODE_TORCH`).
    """
    if gate is not None and c is not None:
        raise MatmulInputError("c and gate are both read as the kernel's C: pass one (a residual or a gate)")
    nodes = _fallback_nodes(bias is not None, activation_of(activation), c is not None, gate is not None)
    y, done = _torch_product(a, b, out_dtype, nodes, bias, c, alpha, beta, scale_a, scale_b, fast_accum)
    rest = [node for node in nodes if node.kind not in done]
    return apply_nodes(rest, y, {"bias": bias, "c": c if gate is None else gate, "beta": beta})


@functools.lru_cache(maxsize=64)
def _fallback_nodes(bias: bool, activation: Activation, residual: bool, gated: bool) -> tuple[Node, ...]:
    """The nodes of the epilogue a `torch_gemm` call computes, walked once per epilogue: a model
    whose table keeps torch runs the fallback on every call."""
    return tuple(Epilogue(bias=bias, activation=activation, residual=residual, gated=gated).tree().walk())


def _torch_product(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, nodes: tuple[Node, ...],
                   bias: torch.Tensor | None, c: torch.Tensor | None, alpha: float, beta: float,
                   scale_a: torch.Tensor | None, scale_b: torch.Tensor | None,
                   fast_accum: bool) -> tuple[torch.Tensor, frozenset[NodeKind]]:
    """torch's strongest GEMM call for the first nodes of an epilogue's tree: the product and
    its scales always, with what that call folds in (a bias, a residual, cuBLASLt's activation);
    the kinds of node it computed (`torch_gemm` applies the rest from `NODE_TORCH`)."""
    product = frozenset({NodeKind.ACCUMULATOR, NodeKind.SCALE})
    if scale_a is not None and scale_b is not None and _blockwise_shapes(a, b.shape[1], scale_a, scale_b):
        return blockwise_mm(a, b, scale_a * alpha if alpha != 1.0 else scale_a, scale_b, out_dtype, bias), \
            product | {NodeKind.BIAS}
    if a.dtype in FP8_DTYPES:
        scale_a = _unit_scale(a.device) if scale_a is None else scale_a
        scale_a = scale_a * alpha if alpha != 1.0 else scale_a
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=_unit_scale(a.device) if scale_b is None else scale_b,
                                bias=bias, out_dtype=out_dtype, use_fast_accum=fast_accum), product | {NodeKind.BIAS}
    if c is None and bias is not None and alpha == 1.0 and out_dtype == a.dtype:
        last = nodes[-1]
        if (last.kind is NodeKind.ACTIVATION and last.activation in LT_ACTIVATIONS and a.device.type == "cuda"
                and tuple(n.kind for n in nodes[:-1]) == (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.BIAS)):
            return torch._addmm_activation(bias, a, b, use_gelu=last.activation is Activation.GELU_TANH), \
                product | {NodeKind.BIAS, NodeKind.ACTIVATION}
        return torch.addmm(bias, a, b), product | {NodeKind.BIAS}
    if c is not None and out_dtype == a.dtype:
        return torch.addmm(c, a, b, beta=beta, alpha=alpha), product | {NodeKind.RESIDUAL}
    y = _product(a, b, out_dtype)
    return (y * alpha if alpha != 1.0 else y), product


_UNIT_SCALES: dict[torch.device, torch.Tensor] = {}


def _unit_scale(device: torch.device) -> torch.Tensor:
    """The scale 1.0 of an fp8 operand given none, made once per device: a new one per call
    was a fill kernel before every torch._scaled_mm (1.4-1.6 us a call in CUDA graphs, H200).
    One first made while a CUDA graph is captured is not kept: its memory is the graph's pool's
    and its fill runs only when the graph replays."""
    one = _UNIT_SCALES.get(device)
    if one is None:
        one = torch.ones((), dtype=torch.float32, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _UNIT_SCALES[device] = one
    return one


_TENSOR = torch.Tensor
_NO_ACTIVATION = Activation.NONE
_MIN_RATIO = 1.0
"""The doors' default min_ratio, one object: the common call's test is by identity."""
_compiled_door: Callable[..., torch.Tensor] | None = None
"""What `matmul` calls while torch.compile traces it (`_op.compiled_matmul`, set when the
operators' module is imported): one operator on the table's key (`mm`, `scaled_mm` or `matmul`),
one node of the graph, instead of the native door Dynamo cannot trace (a graph break a call)."""


def matmul(a: torch.Tensor, b: torch.Tensor, table: BestTable | str | Path,
           out_dtype: torch.dtype | None = None, *, bias: torch.Tensor | None = None,
           activation: Activation | str = Activation.NONE, c: torch.Tensor | None = None, alpha: float = 1.0,
           beta: float | None = None, scale_a: torch.Tensor | None = None,
           scale_b: torch.Tensor | None = None, gate: torch.Tensor | None = None,
           min_ratio: float = _MIN_RATIO) -> torch.Tensor:
    """activation(s * (a @ b) + beta * c + bias), or with a `gate` activation(gate) * (s * (a @
    b) + bias), through the best kernel the table has for this problem, its epilogue and
    scaling; plainly a @ b.

    `out_dtype` is the type of the result: by default the inputs' type for bfloat16 and
    float16, bfloat16 for fp8; torch.float32 (or another 16-bit type) picks the table's kernels
    with that output. The first call for a shape looks the problem up and loads its kernel;
    later calls with the same shapes, strides and dtypes go straight to the launch (a table
    loaded from a path is kept per path).

    An exact entry runs its kernel; a problem that was not tuned runs the kernel of the nearest
    tuned problem of the same dtypes, layout, epilogue and scaling (every kernel is correct for
    every aligned shape; only its speed was measured elsewhere). Where the table has nothing for
    them, or CUTLASS cannot implement the problem, torch computes the same math (`torch_gemm`:
    torch.matmul, F.linear with the bias, torch._scaled_mm with the scales, then the
    activation) and a warning says so once per cause. So it does, with a warning once per entry,
    where the table measured its kernel for the problem (or the nearest one) slower than torch:
    below `min_ratio` of torch's time there (torch kept where it wins); for an fp8 kernel with
    fast accumulation, torch._scaled_mm's fast accumulation, the path the kernel was measured
    against.

    Under torch.compile the call traces as one node (no graph break): a plain 16-bit product the
    operator `torch.ops.cutlass_tune.mm` on a key held to `min_ratio`, fp8 with scales at the
    default `min_ratio` `torch.ops.cutlass_tune.scaled_mm`, any other call
    `torch.ops.cutlass_tune.matmul` (a Python kernel: `.mm`, `.linear` and `.scaled_mm` cost a
    compiled model less host time a call).

    Args:
        bias: N values of the result's dtype, one per output column (nn.Linear's bias).
        activation: applied last: an `Activation` or its name (none, relu, gelu: the erf form, ...).
        c: a residual, M x N row-major of the result's dtype, added times `beta`.
        alpha: scales a @ b; beta: scales c (1 with a `c`; only with one).
        gate: instead of `c`, M x N row-major of the result's dtype: the pre-activation of a
            gated MLP's gate (its gate GEMM's output); the activation applies to it, and the
            result is that times s * (a @ b) + bias (the up projection, fused).
        scale_a, scale_b: fp8 inputs only, both or neither, float32 as torch._scaled_mm takes them:
            one value each (per tensor), or M x 1 (per row of a) and 1 x N (per column of b).
        min_ratio: run torch's path where the table's row measured its kernel at less than this
            ratio to torch (its `ratio`; 0 runs the table's kernel whatever it measured, as
            `cutlass-tune check` does to check the entry's claim).

    Raises:
        MatmulInputError: operands that are not tensors, CPU tensors, unsupported dtypes,
            misaligned or non-contiguous tensors; a bias, residual or scale of the wrong shape,
            dtype or device; an unknown activation; beta without c; both c and gate.
    """
    if _compiled_door is not None and torch.compiler.is_compiling():
        return _compiled_door(a, b, table, out_dtype, bias, activation, c, alpha, beta, scale_a, scale_b, gate,
                              min_ratio)
    native = _native.door
    # Each test's first half is the common call's (arguments left at their defaults, plain tensors, a
    # BestTable) by identity, a few tens of nanoseconds less than its second half, which decides the rest.
    if (native is not None and bias is c is gate is beta is None and alpha == 1.0
            and (activation is _NO_ACTIVATION or activation == "none")
            and (type(a) is _TENSOR or isinstance(a, torch.Tensor))
            and (type(b) is _TENSOR or isinstance(b, torch.Tensor))
            and (scale_a is None or (type(scale_a) is _TENSOR or isinstance(scale_a, torch.Tensor))
                 and (scale_a.dim() < 2 or scale_a.shape[1] == 1))
            and (scale_b is None or type(scale_b) is _TENSOR or isinstance(scale_b, torch.Tensor))
            and (out_dtype is None or isinstance(out_dtype, torch.dtype))
            and (min_ratio is _MIN_RATIO or isinstance(min_ratio, (int, float)))
            and not _profiler_enabled()):
        # The native library's path: the same plan, checked and resolved once per signature (`_resolve_door`);
        # not for block-wise scales (M x K/128), which the Python door expands for the kernel.
        if type(table) is not BestTable:
            table = table if isinstance(table, BestTable) else load_table(str(table))
        return native.matmul(a, b, table.plans.native_key or _native.door_key(table), out_dtype, scale_a, scale_b,
                             min_ratio)
    return _matmul(a, b, table, out_dtype, bias, activation, c, alpha, beta, scale_a, scale_b, gate, min_ratio)


def _matmul(a: torch.Tensor, b: torch.Tensor, table: BestTable | str | Path, out_dtype: torch.dtype | None,
            bias: torch.Tensor | None, activation: Activation | str, c: torch.Tensor | None, alpha: float,
            beta: float | None, scale_a: torch.Tensor | None, scale_b: torch.Tensor | None,
            gate: torch.Tensor | None, min_ratio: float) -> torch.Tensor:
    """`matmul` in Python (every call the native library does not take)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        problem_of(a, b)  # raises, naming the operand that is not a tensor and its type
    act = activation_of(activation)
    operands = (_tensor(bias, "bias"), _tensor(c, "c"), _tensor(scale_a, "scale_a"), _tensor(scale_b, "scale_b"),
                _tensor(gate, "gate"))
    table = table if isinstance(table, BestTable) else load_table(str(table))
    # The call's signature: a tuple, built in a few hundred nanoseconds (a `Call` per call costs more).
    signature = (a.get_device(), a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, out_dtype, act,
                 min_ratio, *(None if t is None else (t.shape, t.stride(), t.dtype) for t in operands))
    ready = table.plans.get(signature)
    if ready is None or not (a.device.type == "cuda" and b.device == a.device
                             and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
                             and all(t is None or (t.device == a.device and t.data_ptr() % 16 == 0)
                                     for t in operands)):
        problem = problem_of(a, b, out_dtype, bias=bias, activation=act, c=c, scale_a=scale_a, scale_b=scale_b,
                             gate=gate)
        call = Call(Kind.DENSE, problem, a.get_device(), min_ratio, signature)
        ready = prepare(table, call)
    else:
        call = None
    if _profiler_enabled():  # `tune-model` reads each problem's kernel time from this range
        with torch.profiler.record_function(PROFILER_RANGE + ready[0].problem.name):
            return _run_ready(table, ready, call, a, b, bias, c, scale_a, scale_b, gate, alpha, beta, act, min_ratio,
                              signature)
    return _run_ready(table, ready, call, a, b, bias, c, scale_a, scale_b, gate, alpha, beta, act, min_ratio, signature)


def _run_ready(table: BestTable, ready: Ready, call: Call | None, a: torch.Tensor, b: torch.Tensor,
               bias: torch.Tensor | None, c: torch.Tensor | None, scale_a: torch.Tensor | None,
               scale_b: torch.Tensor | None, gate: torch.Tensor | None, alpha: float, beta: float | None,
               act: Activation, min_ratio: float, signature: tuple) -> torch.Tensor:
    plan, gemm, _ = ready
    beta = beta_of(c, beta)
    if gemm is not None:
        try:
            return gemm.run(plan.problem, a, b, bias=bias, c=c if gate is None else gate, scale_a=scale_a,
                            scale_b=scale_b, alpha=alpha, beta=beta)
        except KernelStatusError as err:
            call = call or Call(Kind.DENSE, plan.problem, plan.device, min_ratio, signature)
            plan = cannot_implement(table, call, ready, err).plan
    fast_accum = plan.fallback is not None and plan.fallback.fast_accum
    return torch_gemm(a, b, TORCH_DTYPE[plan.problem.dtype_d], bias=bias, activation=act, c=c, alpha=alpha,
                      beta=beta, scale_a=scale_a, scale_b=scale_b, gate=gate, fast_accum=fast_accum)


def _operand_key(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype)


def door_entry(table: BestTable, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None,
               scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, min_ratio: float,
               bias: torch.Tensor | None = None) -> tuple:
    """The native plan entry of a `matmul` call with no epilogue (a bias at most): `matmul`'s checks
    (they raise as the door does), its plan by `matmul`'s signature (one plan cache for both
    paths), its kernel, where the table keeps torch torch.mm for 16-bit inputs of the result's
    type and torch._scaled_mm for fp8 ones with their per-tensor or row-wise scales, else the
    Python door (fp8 without scales; block-wise scales, which a kernel reads expanded)."""
    problem = problem_of(a, b, out_dtype, bias=bias, scale_a=scale_a, scale_b=scale_b)
    if problem.scaling is Scaling.BLOCKWISE:
        return (_native.ENTRY_PYTHON,)
    signature = (a.get_device(), a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, out_dtype,
                 Activation.NONE, min_ratio, _operand_key(bias), None, _operand_key(scale_a), _operand_key(scale_b),
                 None)
    ready = table.plans.get(signature) or prepare(table, Call(Kind.DENSE, problem, a.get_device(), min_ratio,
                                                              signature))
    plain = scale_a is None and a.dtype in (torch.bfloat16, torch.float16) and out_dtype in (None, a.dtype)
    scaled = scale_a is not None and scale_b is not None  # torch._scaled_mm with them (not block-wise: above)
    return _native.plan_entry(ready, plain or scaled)


def _resolve_door(a: torch.Tensor, b: torch.Tensor, key: str, out_dtype: torch.dtype | None,
                  scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, min_ratio: float) -> tuple:
    """The native plan entry of a `matmul` call with no epilogue (`_native.register_door`): `door_entry`."""
    return door_entry(_native.door_table(key), a, b, out_dtype, scale_a, scale_b, min_ratio)


def _door(a: torch.Tensor, b: torch.Tensor, key: str, out_dtype: torch.dtype | None, scale_a: torch.Tensor | None,
          scale_b: torch.Tensor | None, min_ratio: float) -> torch.Tensor:
    return _matmul(a, b, _native.door_table(key), out_dtype, None, Activation.NONE, None, 1.0, None, scale_a,
                   scale_b, None, min_ratio)


_native.register_door("matmul", _resolve_door, _door)
# The door's native path (`_native.door`) is there once the library is loaded: with the door's own
# import, so a process that calls the door and never imports the operators launches from C++ too.
_native.load()
# Last: the operators' module sets `_compiled_door` (it imports this one's names, all defined by now).
from . import _op  # noqa: E402,F401
